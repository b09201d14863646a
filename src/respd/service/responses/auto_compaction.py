"""Automatic compaction (`context_management`) in the response's own stream.

A prompt over its compaction threshold (or over the context) has the turns before its last
user turn replaced by the model's summary. When the response is created that is only
decided (`PendingCompaction`); the summary is made once the stream has begun, as a
`compaction` output item: added, `response.compaction.compacting` while its text is
sampled, done with its sealed content — the events a compaction turn sends. The answer's
generation is then prepared on the compacted prompt and admitted, and its events follow in
the same stream. A summary that fails, or an engine too full to admit the answer, ends the
response `failed`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, replace

from openai.types.responses import ResponseStreamEvent

from respd.engines.base import ChatMessage, Engine
from respd.protocol.errors import APIError
from respd.service.generation import core
from respd.service.generation.core import GenerationSpec
from respd.service.responses.events import ResponseEventMachine
from respd.service.responses.summary import Compacted, stream_compaction
from respd.service.responses.translate import summary_turn
from respd.service.sealing import Sealer

# What runs the answer once its prompt is compacted: its events, the machine started.
Then = Callable[[GenerationSpec], Awaitable[AsyncGenerator[ResponseStreamEvent, None]]]


@dataclass
class PendingCompaction:
    """A prompt to compact: its system turns, the turns the summary replaces, those kept."""

    engine: Engine
    spec: GenerationSpec
    system: list[ChatMessage]
    replaced: list[ChatMessage]
    kept: list[ChatMessage]

    def compacted(self, summary: str) -> GenerationSpec:
        """The spec with the summary in place of the replaced turns."""
        return replace(self.spec, messages=[*self.system, summary_turn(summary), *self.kept])


async def compacting_events(
    machine: ResponseEventMachine,
    pending: PendingCompaction,
    runs: core.ActiveRuns,
    sealer: Sealer,
    then: Then,
) -> AsyncGenerator[ResponseStreamEvent, None]:
    """The response's start, its compaction item as the summary is made, then the answer's
    events (from `then`)."""
    for event in machine.start():
        yield event
    result = Compacted()
    steps = stream_compaction(machine, pending.engine, pending.replaced, runs, sealer, result)
    try:
        async with aclosing(steps):
            async for event in steps:
                yield event
        assert result.summary is not None
        answer = await then(pending.compacted(result.summary.text))
    except APIError as exc:  # the summary failed, the context still overflows, or the
        # engine is too full to admit the answer
        for event in machine.fail(exc.message, code=exc.code or "server_error"):
            yield event
        return
    async with aclosing(answer):
        async for event in answer:
            yield event
