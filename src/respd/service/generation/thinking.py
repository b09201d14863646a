"""Reasoning: splitting generated text into the model's thinking and its answer.

Reasoning models write their thinking between markers before the answer; which markers is
part of the model's profile (`engines/families/reasoning.py`). A model without any gets no
splitting at all.

Thinking is recognised only at the very start of the output (after whitespace): a marker
later in the answer is answer text, and an opening marker inside thinking is thinking text
(the first close marker ends it). **Primed block**: when the rendered prompt already ends
with the opening marker (Qwen3-style templates, `enable_thinking`), generation starts inside
the thinking and only the close marker is generated.

The splitter is incremental, in the style of the tool parser: each delta is answered at
once with what is now decided; text that may be the start of a marker (or whitespace that
may end the thinking) is held back only until the next delta decides it. Whitespace at the
start and end of the thinking and at the start of the answer (after the close marker) is
trimmed. The answer then flows, unchanged, into the tool-call parser or plain text.
"""

from __future__ import annotations

from dataclasses import dataclass

from respd.engines.families.reasoning import ReasoningStyle
from respd.service.generation.output import ReasoningDelta, TextDelta
from respd.service.generation.toolcalls import ParseEvent, ToolCallParser, partial_suffix


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
