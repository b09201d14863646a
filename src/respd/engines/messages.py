"""The conversation as engines receive it: turns of ordered parts (text and images), the
calls an assistant made, the functions a model is offered.

These are plain values every other engine module reads (the protocol in `base.py`,
constraints, model families), so they sit below all of them. A turn keeps each image where
the client put it, between its texts; how an image is written down is the engine's business
(a marker in a rendered template, a content part on the wire).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

# What a tool turn whose images moved to the next turn ends with.
ATTACHED_LINE = "[Image output attached in the next message]"


@dataclass
class ToolCall:
    """A function call the assistant made; `arguments` is the JSON text it produced."""

    id: str
    name: str
    arguments: str

    def as_template_dict(self) -> dict[str, Any]:
        # Hugging Face templates index `tool_call.function.arguments` and usually `tojson`
        # it, so a parsed object renders as the model was trained; unparsable text stays text.
        try:
            args: Any = json.loads(self.arguments)
        except ValueError:
            args = self.arguments
        if not isinstance(args, dict):
            args = self.arguments
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": args},
        }


@dataclass(frozen=True)
class ToolDefinition:
    """A function the model may call: name, description and JSON-Schema parameters."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def as_template_tool(self) -> dict[str, Any]:
        """The Hugging Face shape chat templates (and Chat Completions) use."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description:
            fn["description"] = self.description
        fn["parameters"] = self.parameters or {"type": "object", "properties": {}}
        return {"type": "function", "function": fn}


@dataclass(frozen=True, eq=False)
class Image:
    """An image for a vision model: the encoded file (PNG, JPEG, ...), already decoded from
    its data URI / file / URL and checked by the service."""

    data: bytes
    mime_type: str = ""
    # The client's resolution hint (`low` | `high` | `auto` | `original`); an engine may use
    # it to pick how many tokens the image gets. It is not part of the digest.
    detail: str = "auto"

    @cached_property
    def digest(self) -> str:
        """Content hash: equal images share KV-cache prefixes whatever their source."""
        return hashlib.sha256(self.data).hexdigest()


@dataclass(frozen=True)
class TextPart:
    text: str


Part = TextPart | Image


def as_parts(content: str | Sequence[str | Part]) -> list[Part]:
    """Content as parts: a string is one text part (none when empty); strings in a list are
    text parts."""
    if isinstance(content, str):
        return [TextPart(content)] if content else []
    return [TextPart(p) if isinstance(p, str) else p for p in content]


@dataclass(init=False)
class ChatMessage:
    """One turn of the canonical conversation the service builds from API input."""

    role: str  # system | user | assistant | tool
    # Text and images in the order the client gave them; texts read as joined by newlines.
    content: list[Part]
    tool_calls: list[ToolCall]  # assistant turns
    tool_call_id: str | None  # tool turns: the call this answers
    name: str | None  # tool turns: the function that produced it
    # Assistant turns: reasoning text of this turn (from `reasoning` input items), for
    # templates that render it (`reasoning_content`).
    reasoning: str | None

    def __init__(
        self,
        role: str,
        content: str | Sequence[str | Part] = "",
        tool_calls: list[ToolCall] | None = None,
        tool_call_id: str | None = None,
        name: str | None = None,
        reasoning: str | None = None,
    ) -> None:
        self.role = role
        self.content = as_parts(content)
        self.tool_calls = list(tool_calls or [])
        self.tool_call_id = tool_call_id
        self.name = name
        self.reasoning = reasoning

    @property
    def text(self) -> str:
        """The turn's text parts, joined by newlines (its images left out)."""
        return "\n".join(p.text for p in self.content if isinstance(p, TextPart))

    @property
    def images(self) -> list[Image]:
        return [p for p in self.content if isinstance(p, Image)]

    def rendered(self, image_marker: str | None = None) -> str:
        """The parts as one text, `image_marker` where each image sits. Without a marker
        the turn must hold no image."""
        pieces: list[str] = []
        for part in self.content:
            if isinstance(part, TextPart):
                pieces.append(part.text)
            elif image_marker is None:
                raise ValueError("an image needs a marker to be written as text")
            else:
                pieces.append(image_marker)
        return "\n".join(pieces)

    def as_template_dict(self, image_marker: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.rendered(image_marker)}
        if self.tool_calls:
            out["tool_calls"] = [c.as_template_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        if self.reasoning is not None:
            # Qwen3/DeepSeek-style templates read `reasoning_content`; Gemma-style `reasoning`.
            out["reasoning_content"] = self.reasoning
            out["reasoning"] = self.reasoning
        return out


def message_images(messages: Sequence[ChatMessage]) -> list[Image]:
    """Every image of the conversation, in prompt order."""
    return [image for m in messages for image in m.images]


def images_on_user_turns(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The conversation with images on user turns only, as chat templates and Chat
    Completions take them: a turn of another role keeps its text, and its images move, in
    order, to a user turn right after; a tool turn's text then ends with `ATTACHED_LINE`."""
    out: list[ChatMessage] = []
    for m in messages:
        images = m.images
        if m.role == "user" or not images:
            out.append(m)
            continue
        texts: list[Part] = [p for p in m.content if isinstance(p, TextPart)]
        if m.role == "tool":
            texts.append(TextPart(ATTACHED_LINE))
        out.append(ChatMessage(m.role, texts, m.tool_calls, m.tool_call_id, m.name, m.reasoning))
        out.append(ChatMessage("user", images))
    return out
