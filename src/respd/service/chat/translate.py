"""Chat Completions `messages` → the canonical conversation, media lowered as for Responses:
each turn's images stay in place among its texts (tool results included)."""

from __future__ import annotations

from typing import Any

from respd.engines.base import ChatMessage, ToolCall
from respd.protocol.errors import InvalidRequest, MissingParameter
from respd.service.media.lowering import Lowering, lower_message, lower_tool_output

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


def _tool_calls(raw: Any, param: str) -> list[ToolCall]:
    if not isinstance(raw, list):
        raise InvalidRequest(
            f"Invalid type for '{param}': expected an array.", param=param, code="invalid_type"
        )
    calls = []
    for j, call in enumerate(raw):
        p = f"{param}[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise MissingParameter(f"{p}.function.name")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise MissingParameter(f"{p}.id")
        args = fn.get("arguments")
        calls.append(ToolCall(call_id, fn["name"], args if isinstance(args, str) else "{}"))
    return calls


def chat_messages(messages: list[dict[str, Any]], low: Lowering) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    names: dict[str, str] = {}
    for i, msg in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise InvalidRequest(
                f"Invalid type for '{param}': expected an object.", param=param, code="invalid_type"
            )
        role = msg.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise InvalidRequest(
                f"Invalid value for '{param}.role': expected one of {', '.join(CHAT_ROLES)}, "
                f"got {role!r}.",
                param=f"{param}.role",
                code="invalid_value",
            )
        content = msg.get("content")
        calls = (
            _tool_calls(msg["tool_calls"], f"{param}.tool_calls")
            if (role == "assistant" and msg.get("tool_calls"))
            else []
        )
        if content is None and role != "assistant":
            raise MissingParameter(f"{param}.content")
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if call_id not in names:
                raise InvalidRequest(
                    f"Invalid '{param}.tool_call_id': no earlier assistant message has a tool "
                    f"call with id {call_id!r}.",
                    param=f"{param}.tool_call_id",
                    code="invalid_value",
                )
            parts = lower_tool_output(content, f"{param}.content", low)
            out.append(ChatMessage("tool", parts, tool_call_id=call_id, name=names[call_id]))
            continue
        names.update((c.id, c.name) for c in calls)
        reasoning = msg.get("reasoning_content") if role == "assistant" else None
        turn = lower_message(
            "system" if role == "developer" else role,
            "" if content is None else content,
            f"{param}.content",
            low,
        )
        turn.tool_calls = calls
        if isinstance(reasoning, str) and reasoning:
            turn.reasoning = reasoning
        out.append(turn)
    return out
