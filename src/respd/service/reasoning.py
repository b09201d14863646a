"""Reasoning: splitting generated text into the model's thinking and its answer.

Reasoning models write their thinking between markers before the answer. Which markers a
model uses is read off its chat template (as `tool_formats.detect_format` reads the tool
format); a template without any gets no splitting at all.

| style    | template contains      | thinking                                                 |
|----------|------------------------|----------------------------------------------------------|
| think    | `<think>`              | `<think>…</think>` (Qwen3, DeepSeek-R1, SmolLM3, …)      |
| command  | `<|START_THINKING|>`   | `<|START_THINKING|>…<|END_THINKING|>` (Command R7B)      |
| magistral| `[THINK]`              | `[THINK]…[/THINK]` (Magistral)                           |
| seed     | `<seed:think>`         | `<seed:think>…</seed:think>` (Seed-OSS)                  |
| harmony  | `<|channel|>`          | `<|channel|>analysis<|message|>…<|end|>` (gpt-oss); the |
|          |                        | answer after `<|start|>assistant<|channel|>final<|message|>` |

Thinking is recognised only at the very start of the output (after whitespace): a marker
later in the answer is answer text, and an opening marker inside thinking is thinking text
(the first close marker ends it). **Primed block**: when the rendered prompt already ends
with the opening marker (Qwen3-style templates, `enable_thinking`), generation starts inside
the thinking and only the close marker is generated.

The splitter is incremental, in the style of `tool_parsing.py`: each delta is answered at
once with what is now decided; text that may be the start of a marker (or whitespace that
may end the thinking) is held back only until the next delta decides it. Whitespace at the
start and end of the thinking and at the start of the answer (after the close marker) is
trimmed. The answer then flows, unchanged, into the tool-call parser or plain text.

Reasoning controls (`reasoning.effort`, Chat's `reasoning_effort`) become template
variables: `none`/`off`/`disabled`/`false`/`0` → `enable_thinking=False`; any other value →
`enable_thinking=True` plus the value verbatim as `reasoning_effort` (or `reasoning_strength`
when that is the variable the template reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from respd.engines.base import ChatMessage, Engine
from respd.engines.chat_template import ChatTemplateError
from respd.service.tool_parsing import ParseEvent, TextDelta, ToolCallParser, partial_suffix


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


def template_controls(effort: str | None, template_source: str = "") -> dict[str, Any]:
    """Template variables for a reasoning effort (nothing when none was asked for)."""
    if effort is None or not effort.strip():
        return {}
    if effort.strip().lower() in DISABLED_EFFORTS:
        return {"enable_thinking": False}
    key = (
        "reasoning_strength"
        if "reasoning_strength" in template_source and "reasoning_effort" not in template_source
        else "reasoning_effort"
    )
    return {"enable_thinking": True, key: effort}


@dataclass
class ReasoningDelta:
    """Thinking text, as a parse event next to the tool parser's `TextDelta` and calls."""

    text: str


@dataclass
class AnswerDelta:
    text: str


Piece = ReasoningDelta | AnswerDelta


class ReasoningSplitter:
    """Splits one generation into thinking and answer text for a `ReasoningStyle`.

    `primed`: the prompt ends with the opening marker, so the output starts inside the
    thinking. Token counts passed to `feed` are attributed to the side their text went to
    (`reasoning_tokens`); tokens whose text is still undecided at the start wait for it.
    """

    def __init__(self, style: ReasoningStyle, *, primed: bool = False) -> None:
        self.style = style
        self._state = "reasoning" if primed else "start"  # start|reasoning|header|answer
        self._pending = ""
        self._thought = False  # some thinking text was emitted (leading whitespace is not)
        self._opened = primed  # a thinking block was opened (vs. a plain answer)
        self._undecided_tokens = 0
        self.reasoning_tokens = 0
        self.fed = 0  # characters fed so far

    @property
    def in_reasoning(self) -> bool:
        return self._state == "reasoning"

    @property
    def released(self) -> int:
        """Characters of the fed text decided so far (thinking, answer or markers): the
        answer is always a contiguous run of the fed text ending here."""
        return self.fed - len(self._pending)

    def feed(self, text: str, tokens: int = 0) -> list[Piece]:
        entry = self._state
        out: list[Piece] = []
        self.fed += len(text)
        self._pending += text
        self._advance(out)
        if entry == "reasoning":
            self.reasoning_tokens += tokens
        elif entry == "start":
            self._undecided_tokens += tokens
            if self._state != "start":  # decided: thinking, or a plain answer
                if self._opened:
                    self.reasoning_tokens += self._undecided_tokens
                self._undecided_tokens = 0
        return out

    def finish(self) -> list[Piece]:
        """The end of the generation: whatever is held back is decided now."""
        out: list[Piece] = []
        rest, self._pending = self._pending, ""
        if self._state == "start":
            if rest:
                out.append(AnswerDelta(rest))
        elif self._state == "reasoning":
            self._think(out, rest.rstrip())
        elif self._state == "answer" and rest:
            out.append(AnswerDelta(rest))
        # header: only whitespace or part of a header is left, nothing to answer
        self._undecided_tokens = 0
        return out

    # -- states ----------------------------------------------------------------------------

    def _advance(self, out: list[Piece]) -> None:
        while self._pending:
            before = (self._state, len(self._pending))
            if self._state == "start":
                self._start()
            elif self._state == "reasoning":
                self._reasoning(out)
            elif self._state == "header":
                self._header()
            else:
                out.append(AnswerDelta(self._pending))
                self._pending = ""
            if (self._state, len(self._pending)) == before:
                return  # waiting for more text

    def _start(self) -> None:
        buf = self._pending.lstrip()
        if not buf:
            return
        opening = self.style.open
        if buf.startswith(opening):
            self._pending = buf[len(opening) :]
            self._state = "reasoning"
            self._opened = True
        elif opening.startswith(buf):
            return
        elif self.style.answer_headers:
            self._state = "header"  # e.g. gpt-oss answering on the final channel at once
        else:
            self._state = "answer"  # no thinking: the output is untouched

    def _reasoning(self, out: list[Piece]) -> None:
        buf = self._pending
        close = self.style.close
        at = buf.find(close)
        if at >= 0:
            self._think(out, buf[:at].rstrip())
            self._pending = buf[at + len(close) :]
            self._state = "header"
            return
        keep = partial_suffix(buf, (close,))
        body = buf[: len(buf) - keep]
        ws = len(body) - len(body.rstrip())  # may be the whitespace before the close
        self._think(out, body[: len(body) - ws])
        self._pending = buf[len(body) - ws :]

    def _think(self, out: list[Piece], text: str) -> None:
        if not self._thought:
            text = text.lstrip()
        if text:
            self._thought = True
            out.append(ReasoningDelta(text))

    def _header(self) -> None:
        """After the close marker: skip whitespace and the answer headers, in order."""
        buf = self._pending
        for header in self.style.answer_headers:
            stripped = buf.lstrip()
            if stripped.startswith(header):
                buf = stripped[len(header) :]
            elif stripped and header.startswith(stripped):
                self._pending = buf
                return  # may still become this header
        stripped = buf.lstrip()
        self._pending = stripped
        if stripped:
            self._state = "answer"


def split_all(style: ReasoningStyle, text: str, *, primed: bool = False) -> tuple[str, str]:
    """The whole of a generation, split at once: (thinking, answer)."""
    splitter = ReasoningSplitter(style, primed=primed)
    pieces = splitter.feed(text) + splitter.finish()
    return (
        "".join(p.text for p in pieces if isinstance(p, ReasoningDelta)),
        "".join(p.text for p in pieces if isinstance(p, AnswerDelta)),
    )


@dataclass(frozen=True)
class ReasoningPlan:
    """How one request's output is read for thinking."""

    style: ReasoningStyle
    primed: bool

    def reader(self, parser: ToolCallParser | None) -> ReasoningReader:
        return ReasoningReader(ReasoningSplitter(self.style, primed=self.primed), parser)


def plan_reasoning(
    engine: Engine,
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any] | None,
) -> ReasoningPlan | None:
    """The reasoning style of the engine's template and whether the prompt primes it open
    (rendered once more here: the generation prompt's tail says so)."""
    style = detect_style(engine.template_source)
    if style is None:
        return None
    try:
        prompt = engine.render_prompt(messages, tools=tools, template_kwargs=template_kwargs)
    except ChatTemplateError:
        return ReasoningPlan(style, False)  # the render in `fit_to_context` reports it
    return ReasoningPlan(style, prompt.rstrip().endswith(style.open))


class ReasoningReader:
    """Thinking split off first; the answer goes through the tool-call parser when there is
    one (else it is plain text). Emits the parser's events plus `ReasoningDelta`."""

    def __init__(self, splitter: ReasoningSplitter, parser: ToolCallParser | None) -> None:
        self.splitter = splitter
        self.parser = parser
        self._answer_start = -1  # where the answer begins in the fed text, once it does

    @property
    def reasoning_tokens(self) -> int:
        return self.splitter.reasoning_tokens

    def feed(self, text: str, tokens: int = 0) -> list[ParseEvent | ReasoningDelta]:
        return self._route(self.splitter.feed(text, tokens), final=False)

    def finish(self) -> list[ParseEvent | ReasoningDelta]:
        return self._route(self.splitter.finish(), final=True)

    def _route(self, pieces: list[Piece], *, final: bool) -> list[ParseEvent | ReasoningDelta]:
        """Thinking as is; answer text as `TextDelta`s whose `start` is an offset in the text
        fed to this reader (as the tool parser's are in its own input), so logprobs can
        follow it."""
        out: list[ParseEvent | ReasoningDelta] = []
        answer = sum(len(p.text) for p in pieces if isinstance(p, AnswerDelta))
        at = self.splitter.released - answer  # where this call's answer text starts
        if answer and self._answer_start < 0:
            self._answer_start = at
        for piece in pieces:
            if isinstance(piece, ReasoningDelta):
                out.append(piece)
            elif self.parser is None:
                out.append(TextDelta(piece.text, start=at))
                at += len(piece.text)
            else:
                out += self._shifted(self.parser.feed(piece.text))
        if final and self.parser is not None:
            out += self._shifted(self.parser.finish())
        return out

    def _shifted(self, events: list[ParseEvent]) -> list[ParseEvent]:
        """The parser's text offsets (in the answer) as offsets in the fed text."""
        return [
            TextDelta(e.text, start=e.start + self._answer_start)
            if isinstance(e, TextDelta) and e.start >= 0
            else e
            for e in events
        ]
