"""One model family's profile, detected once when a model loads.

Every consumer (prompt building, constrained decoding, output reading, token decoding)
reads the profile; nothing searches template text per request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from respd.engines.families.reasoning import (
    ReasoningStyle,
    detect_style,
    effort_variable,
    template_controls,
)
from respd.engines.families.tools import GENERIC, HERMES, LLAMA3, MISTRAL, ToolFormat

# Special tokens that end an assistant turn in the common template families.
END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")
_TOOLS_VAR = re.compile(r"\btools\b")


@dataclass(frozen=True)
class ModelProfile:
    """What a model family writes and reads.

    `tool_format` None: the engine reports calls itself (a remote server) and generated text
    is never searched for calls; likewise `reasoning` None means no thinking markers.
    """

    tool_format: ToolFormat | None = GENERIC
    tools_native: bool = False  # the template renders `tools` itself
    reasoning: ReasoningStyle | None = None
    effort_variable: str = "reasoning_effort"
    # Marker texts that end a turn / that the output reader must see as text.
    end_of_turn: tuple[str, ...] = ()
    text_markers: tuple[str, ...] = field(default=())

    def template_controls(self, effort: str | None) -> dict[str, Any]:
        return template_controls(effort, self.effort_variable)

    @property
    def harmony(self) -> bool:
        return self.reasoning is not None and self.reasoning.name == "harmony"


# A message-level engine: text, reasoning and calls arrive already separated.
STRUCTURED = ModelProfile(tool_format=None, tools_native=True)


def detect_tool_format(template_source: str) -> tuple[ToolFormat, bool]:
    """The family of the template in use, and whether the template renders `tools` itself."""
    if not _TOOLS_VAR.search(template_source):
        return GENERIC, False
    if "[TOOL_CALLS]" in template_source:
        return MISTRAL, True
    if "<|python_tag|>" in template_source or "<|start_header_id|>" in template_source:
        return LLAMA3, True
    # Qwen, Hermes and most others; also the de-facto default for unknown tool templates.
    return HERMES, True


def detect_profile(template_source: str) -> ModelProfile:
    """The profile a chat template implies."""
    fmt, native = detect_tool_format(template_source)
    style = detect_style(template_source)
    harmony = style is not None and style.name == "harmony"
    # gpt-oss: <|end|> ends a message (a channel), not the turn.
    end = tuple(
        m for m in END_OF_TURN_MARKERS if m in template_source and not (harmony and m == "<|end|>")
    )
    markers = [fmt.call_open.strip(), fmt.call_close.strip(), *fmt.triggers]
    if style is not None:
        markers += [style.open, style.close, *style.answer_headers]
    if harmony:
        markers += ["<|channel|>", "<|message|>", "<|start|>", "<|end|>"]
    # Each marker's pieces that a vocabulary may hold as single control tokens.
    pieces = {p for m in markers for p in _control_pieces(m)}
    text_markers = tuple(sorted(p for p in pieces if p and p in template_source))
    return ModelProfile(
        tool_format=fmt,
        tools_native=native,
        reasoning=style,
        effort_variable=effort_variable(template_source),
        end_of_turn=end,
        text_markers=text_markers,
    )


def _control_pieces(marker: str) -> list[str]:
    """`<|start|>assistant` → [`<|start|>`]; `<tool_call>` → [`<tool_call>`]."""
    found = re.findall(r"<\|[^|>]+\|>|\[/?[A-Z_]+\]|</?[a-z_:]+>", marker)
    return found or [marker]
