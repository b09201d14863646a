"""Stored item shapes and list pages.

Input items are stored in the shape `input_items.list` and conversation items return: every
item has a stable `id`, a string input becomes a user message with one `input_text` part, and
message content is always a list of typed parts. Replaying them through `translate.py` yields
exactly the messages the original request produced, so a chained prompt is token-identical.
"""

from __future__ import annotations

from typing import Any

from respd.service.ids import new_id
from respd.service.media.parts import IMAGE_PARTS, TEXT_PARTS

JSON = dict[str, Any]

_ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fc",
    "reasoning": "rs",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctc",
    "local_shell_call": "lsh",
    "local_shell_call_output": "lsh",
}


def _text_part(role: str, text: str) -> JSON:
    if role == "assistant":
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "input_text", "text": text}


def _image_part(part: JSON) -> JSON:
    """An image part in the Responses shape. Its source (a data URI stays the data URI the
    client sent, or a file_id, or a URL) is kept as given, never the decoded bytes, so a
    replay resolves and lowers it exactly as the first request did."""
    if part.get("type") == "image_url":  # the Chat Completions spelling
        inner = part.get("image_url")
        url = inner.get("url") if isinstance(inner, dict) else inner
        detail = inner.get("detail") if isinstance(inner, dict) else None
        return {"type": "input_image", "image_url": url, "detail": detail or "auto"}
    out = dict(part)
    if out.get("detail") is None:
        out["detail"] = "auto"
    return out


def _parts(role: str, content: Any) -> list[JSON]:
    if isinstance(content, str):
        return [_text_part(role, content)]
    parts: list[JSON] = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in TEXT_PARTS:
            parts.append(_text_part(role, str(part.get("text", ""))))
        elif isinstance(part, dict) and part.get("type") in IMAGE_PARTS:
            parts.append(_image_part(part))
        else:
            parts.append(dict(part))
    return parts


def normalize_items(items: str | list[JSON] | None) -> list[JSON]:
    """Input (already validated by `translate.input_to_messages`) → stored items with ids."""
    if items is None:
        return []
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    stored: list[JSON] = []
    seen: set[str] = set()
    for raw in items:
        item = dict(raw)
        kind = item.setdefault("type", "message")
        if kind == "message":
            item["content"] = _parts(str(item.get("role")), item.get("content", []))
            item.setdefault("status", "completed")
        item_id = item.get("id")
        if not isinstance(item_id, str) or not item_id or item_id in seen:
            item["id"] = new_id(_ID_PREFIX.get(str(kind), "item"))
        seen.add(item["id"])
        stored.append(item)
    return stored
