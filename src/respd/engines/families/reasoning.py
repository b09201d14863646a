"""How reasoning models mark their thinking, and how a reasoning effort reaches a template.

| style    | template contains      | thinking                                                 |
|----------|------------------------|----------------------------------------------------------|
| think    | `<think>`              | `<think>…</think>` (Qwen3, DeepSeek-R1, SmolLM3, …)      |
| command  | `<|START_THINKING|>`   | `<|START_THINKING|>…<|END_THINKING|>` (Command R7B)      |
| magistral| `[THINK]`              | `[THINK]…[/THINK]` (Magistral)                           |
| seed     | `<seed:think>`         | `<seed:think>…</seed:think>` (Seed-OSS)                  |
| harmony  | `<|channel|>`          | `<|channel|>analysis<|message|>…<|end|>` (gpt-oss); the |
|          |                        | answer after `<|start|>assistant<|channel|>final<|message|>` |

Reasoning controls (`reasoning.effort`, Chat's `reasoning_effort`) become template
variables: `none`/`off`/`disabled`/`false`/`0` → `enable_thinking=False`; any other value →
`enable_thinking=True` plus the value verbatim as `reasoning_effort` (or `reasoning_strength`
when that is the variable the template reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReasoningStyle:
    name: str
    open: str
    close: str
    # Text that may stand between the close marker (or the start of the output) and the
    # answer, skipped in order, each optional (gpt-oss's final-channel header).
    answer_headers: tuple[str, ...] = ()


THINK = ReasoningStyle("think", "<think>", "</think>")
COMMAND = ReasoningStyle("command", "<|START_THINKING|>", "<|END_THINKING|>")
MAGISTRAL = ReasoningStyle("magistral", "[THINK]", "[/THINK]")
SEED = ReasoningStyle("seed", "<seed:think>", "</seed:think>")
HARMONY = ReasoningStyle(
    "harmony",
    "<|channel|>analysis<|message|>",
    "<|end|>",
    answer_headers=("<|start|>assistant", "<|channel|>final<|message|>"),
)
STYLES = {s.name: s for s in (THINK, COMMAND, MAGISTRAL, SEED, HARMONY)}

DISABLED_EFFORTS = frozenset({"none", "off", "disabled", "false", "0"})


def detect_style(template_source: str) -> ReasoningStyle | None:
    """The marker style a chat template uses, or None (no splitting)."""
    if "<|START_THINKING|>" in template_source:
        return COMMAND
    if "[THINK]" in template_source:
        return MAGISTRAL
    if "<seed:think>" in template_source:
        return SEED
    if "<|channel|>" in template_source and "analysis" in template_source:
        return HARMONY
    if "<think>" in template_source or "</think>" in template_source:
        return THINK
    return None


def effort_variable(template_source: str) -> str:
    """The template variable that carries an effort level."""
    if "reasoning_strength" in template_source and "reasoning_effort" not in template_source:
        return "reasoning_strength"
    return "reasoning_effort"


def effort_disabled(effort: str | None) -> bool:
    return effort is not None and effort.strip().lower() in DISABLED_EFFORTS


def template_controls(effort: str | None, variable: str = "reasoning_effort") -> dict[str, Any]:
    """Template variables for a reasoning effort (nothing when none was asked for)."""
    if effort is None or not effort.strip():
        return {}
    if effort_disabled(effort):
        return {"enable_thinking": False}
    return {"enable_thinking": True, variable: effort}
