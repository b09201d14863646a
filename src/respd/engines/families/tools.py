"""How a model family writes function calls, and how tools reach a template without tool support.

One `ToolFormat` describes a family's wire shape twice: for reading (the markers that open a
run of calls, the filler allowed between calls) and for writing (the exact text the grammar
forces when a call is required). `profile.py` reads the format off the chat template.

The generic format, for templates that know nothing of tools (SmolLM2's plain ChatML), puts
the tool list and the calling convention in the system prompt and uses the Hermes wire shape:

    <tool_call>
    {"name": "<function name>", "arguments": {<arguments object>}}
    </tool_call>

Earlier calls render the same way inside assistant turns, and tool results come back as a
user turn holding `<tool_response>…</tool_response>`, so any template can carry a round trip.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from respd.engines.messages import ChatMessage, TextPart


@dataclass(frozen=True)
class ToolFormat:
    name: str  # hermes | llama3 | mistral | generic
    triggers: tuple[str, ...]  # text that opens a run of calls
    fillers: tuple[str, ...]  # text skipped between calls (closing tags, separators)
    bare_json: bool  # a JSON object at the very start of the output is a call (Llama 3)
    # What the grammar writes: list_open (call_open CALL call_close) (separator …)* list_close
    list_open: str
    call_open: str
    call_close: str
    separator: str
    list_close: str
    args_key: str  # "arguments" or "parameters"


HERMES = ToolFormat(
    name="hermes",
    triggers=("<tool_call>",),
    fillers=("</tool_call>", "<tool_call>", ","),
    bare_json=False,
    list_open="",
    call_open="<tool_call>\n",
    call_close="\n</tool_call>",
    separator="\n",
    list_close="",
    args_key="arguments",
)
GENERIC = ToolFormat(**{**HERMES.__dict__, "name": "generic"})
LLAMA3 = ToolFormat(
    name="llama3",
    triggers=("<|python_tag|>",),
    fillers=(";", ",", "<|python_tag|>", "<|eom_id|>"),
    bare_json=True,
    list_open="",
    call_open="",
    call_close="",
    separator="; ",
    list_close="",
    args_key="parameters",
)
MISTRAL = ToolFormat(
    name="mistral",
    triggers=("[TOOL_CALLS]",),
    fillers=("[TOOL_CALLS]", "[", "]", ","),
    bare_json=False,
    list_open="[TOOL_CALLS][",
    call_open="",
    call_close="",
    separator=", ",
    list_close="]",
    args_key="arguments",
)
FORMATS = {f.name: f for f in (HERMES, GENERIC, LLAMA3, MISTRAL)}

GENERIC_PROMPT = (
    "# Tools\n\n"
    "You may call one or more functions to help with the user's request. The functions are "
    "described in JSON Schema inside <tools></tools>:\n<tools>\n{tools}\n</tools>\n\n"
    "To call a function, reply with a JSON object holding its name and arguments inside "
    "<tool_call></tool_call> tags, one call per tag:\n<tool_call>\n"
    '{{"name": "<function name>", "arguments": <arguments object>}}\n</tool_call>\n'
    "Results come back inside <tool_response></tool_response> tags."
)


def generic_call_text(name: str, arguments: str) -> str:
    call = f'{{"name": {json.dumps(name)}, "arguments": {arguments or "{}"}}}'
    return f"<tool_call>\n{call}\n</tool_call>"


def _is_tool_response(m: ChatMessage) -> bool:
    """A user turn that carries tool results (the next result joins it)."""
    first = m.content[0] if m.content else None
    return (
        m.role == "user"
        and isinstance(first, TextPart)
        and first.text.startswith("<tool_response>")
    )


def generic_messages(
    messages: list[ChatMessage], tools: list[dict[str, Any]] | None
) -> list[ChatMessage]:
    """Rewrite tool turns as plain text for a template that has no tool support."""
    out: list[ChatMessage] = []
    for m in messages:
        if m.role == "tool":
            block = TextPart(f"<tool_response>\n{m.text}\n</tool_response>")
            if out and _is_tool_response(out[-1]):
                out[-1] = ChatMessage("user", [*out[-1].content, block])
            else:
                out.append(ChatMessage("user", [block]))
        elif m.tool_calls:
            calls = "\n".join(generic_call_text(c.name, c.arguments) for c in m.tool_calls)
            parts = [*m.content, TextPart(calls)] if m.text.strip() else [TextPart(calls)]
            out.append(ChatMessage(m.role, parts, reasoning=m.reasoning))
        else:
            # Images travel with their turn, in place.
            out.append(ChatMessage(m.role, m.content, reasoning=m.reasoning))
    if tools:
        prompt = GENERIC_PROMPT.format(tools="\n".join(json.dumps(t) for t in tools))
        if out and out[0].role == "system":
            first = out[0].content
            tail = TextPart(f"\n{prompt}") if first else TextPart(f"\n\n{prompt}")
            out[0] = ChatMessage("system", [*first, tail])
        else:
            out.insert(0, ChatMessage("system", prompt))
    return out
