"""Reading one generation's chunks into output events.

The generation core holds one `OutputReader` per request and calls only its declared
members: `feed`, `finish`, `stopped`, `looped`, `reasoning_tokens`. Inside, raw text goes
through stop sequences, then the thinking splitter (when the model has thinking markers),
then the tool-call parser (when tools were offered), and answer text picks up the logprobs
of the tokens that produced it; all of the output passes the repetition stop. Fragments a
message-level engine already separated (`TokenChunk.reasoning`, `.calls`) become the same
events directly.
"""

from __future__ import annotations

from collections.abc import Collection

from respd.engines.base import TokenChunk
from respd.engines.families.profile import ModelProfile
from respd.service.generation.logprobs import LogprobAligner
from respd.service.generation.output import (
    ArgumentsDelta,
    CallFinished,
    CallStarted,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
)
from respd.service.generation.repetition import RepetitionStop
from respd.service.generation.stops import StopMatcher
from respd.service.generation.thinking import ReasoningReader, ReasoningSplitter
from respd.service.generation.toolcalls import ToolCallParser


class OutputReader:
    def __init__(
        self,
        profile: ModelProfile,
        *,
        reasoning_open: bool = False,
        tool_names: Collection[str] = (),
        max_calls: int | None = None,
        stops: list[str] | None = None,
        logprobs: bool = False,
        repetition_stop: int = 0,
    ) -> None:
        fmt = profile.tool_format
        parser = (
            ToolCallParser(fmt, set(tool_names), max_calls)
            if fmt is not None and tool_names
            else None
        )
        self._text: ReasoningReader | ToolCallParser | None = parser
        if profile.reasoning is not None:
            splitter = ReasoningSplitter(profile.reasoning, primed=reasoning_open)
            self._text = ReasoningReader(splitter, parser)
        self._stops = StopMatcher(stops or [])
        self._aligner = LogprobAligner() if logprobs else None
        self._released = 0  # characters of raw text passed on (plain text only)
        self._max_calls = max_calls
        # Calls a message-level engine reports: its index → ours (None: over `max_calls`).
        self._calls: dict[int, tuple[int | None, str, str]] = {}
        self._structured_calls = 0
        self._structured_reasoning_tokens = 0
        self._loop = RepetitionStop(repetition_stop)

    @property
    def stopped(self) -> bool:
        """A stop sequence appeared: nothing more will be read."""
        return self._stops.stopped

    @property
    def looped(self) -> bool:
        """The output fell into a loop (see `repetition.py`): the turn should end."""
        return self._loop.fired

    @property
    def reasoning_tokens(self) -> int:
        counted = self._text.reasoning_tokens if isinstance(self._text, ReasoningReader) else 0
        return counted + self._structured_reasoning_tokens

    def feed(self, chunk: TokenChunk) -> list[OutputEvent]:
        out: list[OutputEvent] = []
        if chunk.reasoning:
            out.append(ReasoningDelta(chunk.reasoning))
            if not chunk.text and not chunk.calls:
                self._structured_reasoning_tokens += chunk.n_tokens
        if self._aligner is not None:
            self._aligner.feed(chunk.text, chunk.logprobs)
        self._loop.feed(chunk.reasoning + chunk.text + "".join(c.arguments for c in chunk.calls))
        text = self._stops.feed(chunk.text)
        if text or (chunk.n_tokens and self._text is not None):
            out += self._read(text, chunk.n_tokens)
        for call in chunk.calls:
            out += self._structured(call.index, call.name, call.arguments)
        return out

    def finish(self, *, cut_off: bool = False) -> list[OutputEvent]:
        """The end of the generation (`cut_off`: by the token budget): what is held back is
        decided now, and calls still open are closed."""
        out = self._read(self._stops.flush(), 0, final=True)
        for index, (ours, name, arguments) in sorted(self._calls.items()):
            if ours is not None:
                out.append(CallFinished(ours, name, arguments, complete=not cut_off))
            del self._calls[index]
        return out

    def _read(self, text: str, tokens: int, *, final: bool = False) -> list[OutputEvent]:
        events: list[OutputEvent]
        if self._text is None:
            events = [TextDelta(text, start=self._released)] if text else []
            self._released += len(text)
        else:
            events = list(self._text.feed(text, tokens)) if (text or tokens) else []
            if final:
                events += self._text.finish()
        if self._aligner is not None:
            for event in events:
                if isinstance(event, TextDelta):
                    end = event.start + len(event.text)
                    event.logprobs = self._aligner.take(event.start, end)
        return events

    def _structured(self, index: int, name: str | None, arguments: str) -> list[OutputEvent]:
        out: list[OutputEvent] = []
        if index not in self._calls:
            over = self._max_calls is not None and self._structured_calls >= self._max_calls
            ours = None if over else self._structured_calls
            self._calls[index] = (ours, name or "", "")
            if ours is not None:
                self._structured_calls += 1
                out.append(CallStarted(ours, name or ""))
        ours, known, so_far = self._calls[index]
        self._calls[index] = (ours, known or name or "", so_far + arguments)
        if ours is not None and arguments:
            out.append(ArgumentsDelta(ours, arguments))
        return out
