"""The worker's outbox hands a step's events to their loops in one call per loop, in
order; the reading end joins tokens that queued up; a closed loop cancels its jobs."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from respd.engines.base import Admitted, GenerationDone, GenerationEvent, TokenChunk
from respd.engines.llamacpp.outbox import Batch, EventBuffer, Outbox


@dataclass(eq=False)
class Job:
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[Batch] = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)


async def _read_all(buffer: EventBuffer) -> list[GenerationEvent]:
    events: list[GenerationEvent] = []
    while not events or not isinstance(events[-1], GenerationDone):
        events.append(await asyncio.wait_for(buffer.next(), 5))
    return events


async def test_one_hand_over_per_step_and_tokens_joined() -> None:
    loop = asyncio.get_running_loop()
    a, b = Job(loop), Job(loop)
    outbox = Outbox()
    calls = 0
    real = loop.call_soon_threadsafe

    def counting(*args: object) -> asyncio.Handle:
        nonlocal calls
        calls += 1
        return real(*args)  # type: ignore[arg-type]

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:

        def worker() -> None:  # two steps, as the decode thread would run them
            outbox.put(a, Admitted())
            outbox.put(b, Admitted())
            outbox.put(a, TokenChunk("Hel", [1]))
            outbox.put(b, TokenChunk("x", [9]))
            outbox.flush()
            outbox.put(a, TokenChunk("lo", [2], []))
            outbox.put(a, GenerationDone("stop", 3, 2))
            outbox.put(b, GenerationDone("length", 3, 1))
            outbox.flush()

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        events_a = await _read_all(EventBuffer(a.out))
        events_b = await _read_all(EventBuffer(b.out))
    finally:
        del loop.call_soon_threadsafe
    assert calls == 2  # one per step for both jobs
    assert isinstance(events_a[0], Admitted)
    joined = events_a[1]
    assert isinstance(joined, TokenChunk)
    assert (joined.text, joined.token_ids) == ("Hello", [1, 2])
    assert isinstance(events_a[2], GenerationDone)
    assert len(events_a) == 3
    assert [type(e) for e in events_b] == [Admitted, TokenChunk, GenerationDone]


async def test_a_closed_loop_cancels_its_jobs_only() -> None:
    dead_loop = asyncio.new_event_loop()
    dead_loop.close()
    live = Job(asyncio.get_running_loop())
    dead = Job(dead_loop)
    outbox = Outbox()
    outbox.put(dead, TokenChunk("a", [1]))
    outbox.put(live, GenerationDone("stop", 1, 0))
    outbox.flush()
    assert dead.cancel.is_set()
    assert not live.cancel.is_set()
    assert isinstance(await asyncio.wait_for(EventBuffer(live.out).next(), 5), GenerationDone)
    outbox.flush()  # nothing held: no call at all
