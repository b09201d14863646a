"""The admission gate: slots first, then lanes served in turn; a full queue refuses only a
lane over its share; cancelled or dropped waiters leave the queue."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest

from respd.engines.base import EngineBusy, GenerationDone, GenerationEvent, TokenChunk
from respd.service.generation.admission import LANE, AdmissionGate


class Script:
    """An engine stream that yields one token, then waits for `finish`."""

    def __init__(self, name: str, order: list[str]) -> None:
        self.name = name
        self.order = order
        self.finish = asyncio.Event()
        self.closed = False

    def __aiter__(self) -> Script:
        return self

    async def __anext__(self) -> GenerationEvent:
        if self.name not in self.order:
            self.order.append(self.name)
            return TokenChunk("x", 1)
        await self.finish.wait()
        if self.closed:
            raise StopAsyncIteration
        self.closed = True
        return GenerationDone("stop", 1, 1)

    def cancel(self) -> None:
        self.finish.set()

    def wrap_up(self) -> bool:
        self.cancel()
        return False

    async def aclose(self) -> None:
        self.closed = True
        self.finish.set()


def opened(gate: AdmissionGate, lane: str, name: str, order: list[str], scripts: dict[str, Any]):
    def start() -> Script:
        scripts[name] = Script(name, order)
        return scripts[name]

    token = LANE.set(lane)
    try:
        return gate.open("m", start, 1)
    finally:
        LANE.reset(token)


async def drain(stream: Any) -> None:
    async for _ in stream:
        pass


async def test_lanes_take_turns_for_freed_slots() -> None:
    gate = AdmissionGate(slots=1, queue=10)
    order: list[str] = []
    scripts: dict[str, Any] = {}
    streams = [opened(gate, "a", f"a{i}", order, scripts) for i in range(4)]
    streams += [opened(gate, "b", f"b{i}", order, scripts) for i in range(2)]
    assert gate.queued() == 5
    tasks = [asyncio.create_task(drain(s)) for s in streams]
    for _ in range(6):
        await asyncio.sleep(0.01)
        running = order[-1]
        scripts[running].finish.set()
    await asyncio.gather(*tasks)
    assert order == ["a0", "a1", "b0", "a2", "b1", "a3"]
    assert gate.queued() == 0


async def test_full_queue_refuses_only_a_lane_over_its_share() -> None:
    gate = AdmissionGate(slots=1, queue=4)
    order: list[str] = []
    scripts: dict[str, Any] = {}
    held = [opened(gate, "a", f"a{i}", order, scripts) for i in range(5)]  # 1 slot + 4
    with pytest.raises(EngineBusy):
        opened(gate, "a", "a5", order, scripts)
    held.append(opened(gate, "b", "b0", order, scripts))  # B's share is 2 of the 4
    held.append(opened(gate, "b", "b1", order, scripts))
    with pytest.raises(EngineBusy):
        opened(gate, "b", "b2", order, scripts)
    for stream in held:
        await stream.aclose()
    assert gate.queued() == 0


async def test_cancelled_and_dropped_waiters_free_their_place() -> None:
    gate = AdmissionGate(slots=1, queue=2)
    order: list[str] = []
    scripts: dict[str, Any] = {}
    first = opened(gate, "a", "a0", order, scripts)
    waiting = opened(gate, "a", "a1", order, scripts)
    dropped = opened(gate, "a", "a2", order, scripts)
    waiting.cancel()
    assert isinstance(await waiting.__anext__(), GenerationDone)  # cancelled, never started
    assert "a1" not in scripts
    del dropped
    gc.collect()
    await first.aclose()
    assert gate.queued() == 0
    again = opened(gate, "a", "a3", order, scripts)  # the slot is free again
    assert "a3" in scripts
    await again.aclose()


async def test_lanes_share_nothing_between_engines() -> None:
    gate = AdmissionGate(slots=1, queue=0, per_engine={"other": 2})
    order: list[str] = []

    def start() -> AsyncIterator[Any]:
        return Script("x", order)  # type: ignore[return-value]

    held = [gate.open("other", start, 1), gate.open("other", start, 1), gate.open("m", start, 1)]
    with pytest.raises(EngineBusy):
        gate.open("m", start, 1)
    for stream in held:
        await stream.aclose()
