"""How events cross from the decode worker to the event loops that read them.

Every `call_soon_threadsafe` writes to the loop's self-pipe and wakes it, and each wake-up
costs the loop a pass plus the GIL hand-over, while two llama.cpp threads want both cores.
So the worker collects a step's events (`Outbox.put`) and hands them over once per loop per
step (`Outbox.flush`): one wake-up for all the sequences of a step, each job's events as
one list.

On the reading side (`EventBuffer`), tokens that queued up while the reader was busy
(a slow client, a loaded loop) are joined into one `TokenChunk`, so everything downstream
does its per-event work once for them instead of once per token.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from respd.engines.base import GenerationEvent, TokenChunk

Batch = list[GenerationEvent]


class Recipient(Protocol):
    """What the outbox needs of a job: its loop, its queue, and a way to stop it."""

    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[Batch]
    cancel: threading.Event


def _deliver(batches: Sequence[tuple[asyncio.Queue[Batch], Batch]]) -> None:
    for queue, events in batches:
        queue.put_nowait(events)


class Outbox:
    """Events produced on the worker thread, held until the end of its step. Only the
    worker thread uses an outbox."""

    def __init__(self) -> None:
        self._held: dict[Recipient, Batch] = {}  # jobs hash by identity

    def put(self, job: Recipient, event: GenerationEvent) -> None:
        self._held.setdefault(job, []).append(event)

    def flush(self) -> None:
        """Hand every held event to its loop: one call per loop, in the order put."""
        if not self._held:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Recipient, Batch]]] = {}
        for job, events in self._held.items():
            by_loop.setdefault(job.loop, []).append((job, events))
        self._held.clear()
        for loop, entries in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, [(job.out, events) for job, events in entries])
            except RuntimeError:
                # The loop is closed: nobody reads these jobs any more, so they end at the
                # next step like cancelled ones instead of stopping the worker.
                for job, _ in entries:
                    job.cancel.set()


def join_chunks(first: TokenChunk, more: Sequence[TokenChunk]) -> TokenChunk:
    """Consecutive token chunks as one (text, ids and logprobs in order)."""
    ids = list(first.token_ids)
    logprobs = list(first.logprobs)
    text = [first.text]
    for chunk in more:
        text.append(chunk.text)
        ids += chunk.token_ids
        logprobs += chunk.logprobs
    return TokenChunk("".join(text), ids, logprobs)


class EventBuffer:
    """The reading end of one job's queue: events in order, ready tokens joined."""

    def __init__(self, queue: asyncio.Queue[Batch]) -> None:
        self._queue = queue
        self._ready: deque[GenerationEvent] = deque()

    async def next(self) -> GenerationEvent:
        if not self._ready:
            self._ready.extend(await self._queue.get())
        while not self._queue.empty():
            self._ready.extend(self._queue.get_nowait())
        event = self._ready.popleft()
        if not isinstance(event, TokenChunk) or not self._ready:
            return event
        more: list[TokenChunk] = []
        while self._ready and isinstance(self._ready[0], TokenChunk):
            more.append(self._ready.popleft())  # type: ignore[arg-type]
        return join_chunks(event, more) if more else event
