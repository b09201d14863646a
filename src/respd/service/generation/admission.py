"""Admission to an engine, shared fairly between identities.

An engine decodes a few sequences at once (its slots). Without a gate, requests beyond
them queue inside the engine first come, first served, so one key that posts 80 background
responses fills the whole queue and every other key meets a 503. The gate holds that queue
here instead, one lane per identity: a freed slot goes to the next lane in turn
(round-robin), and a full queue refuses only a lane that already holds its share of it
(queue / lanes waiting), so a key arriving behind a flood is queued and served after at
most one request of each other waiting key.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from respd.engines.base import EngineBusy, GenerationDone, GenerationEvent, GenerationStream

# Whose request is being served: the lane it queues in (set by the HTTP layer with the
# caller's identity; a background job's task inherits it).
LANE: contextvars.ContextVar[str] = contextvars.ContextVar("respd_lane", default="")


@dataclass
class _Engine:
    """One engine's slots in use and its waiting requests, by lane (held weakly: a request
    its caller dropped unread leaves the queue with it)."""

    slots: int
    running: int = 0
    cancelled: int = 0  # requests cancelled before their turn: the engine never saw them
    waiting: OrderedDict[str, deque[weakref.ref[_GatedStream]]] = field(default_factory=OrderedDict)

    def queued(self) -> int:
        return sum(len(q) for q in self.waiting.values())


class AdmissionGate:
    """Slots per engine (by model id; `slots` for any other) and the waiting requests
    allowed beyond them (`queue`), shared between lanes."""

    def __init__(self, slots: int, queue: int, per_engine: dict[str, int] | None = None) -> None:
        self.slots = slots
        self.queue = queue
        self.per_engine = dict(per_engine or {})
        self._engines: dict[str, _Engine] = {}

    def _engine(self, engine_id: str) -> _Engine:
        state = self._engines.get(engine_id)
        if state is None:
            slots = self.per_engine.get(engine_id, self.slots)
            state = self._engines[engine_id] = _Engine(slots)
        return state

    def queued(self, engine_id: str | None = None) -> int:
        """Requests waiting for a slot (of one engine, or of all)."""
        states = self._engines.values() if engine_id is None else [self._engine(engine_id)]
        return sum(s.queued() for s in states)

    def cancelled(self, engine_id: str) -> int:
        """Requests for one engine cancelled while they waited for a slot."""
        return self._engine(engine_id).cancelled

    def open(
        self, engine_id: str, start: Callable[[], GenerationStream], prompt_tokens: int
    ) -> GenerationStream:
        """The generation `start` begins: at once while a slot is free and nobody waits,
        else once its lane's turn comes. Raises `EngineBusy` when the queue is full and
        this lane already holds its share of it."""
        state = self._engine(engine_id)
        lane = LANE.get()
        if state.running < state.slots and not state.waiting:
            state.running += 1
            try:
                inner = start()
            except BaseException:
                self._release(state)
                raise
            return _GatedStream(self, state, lane, start, prompt_tokens, inner)
        queued = state.queued()
        mine = len(state.waiting.get(lane, ()))
        lanes = len(state.waiting) + (lane not in state.waiting)
        if queued >= self.queue and mine >= math.ceil(self.queue / lanes):
            raise EngineBusy(f"all {state.slots} slots are busy and {queued} requests are queued")
        stream = _GatedStream(self, state, lane, start, prompt_tokens, None)
        state.waiting.setdefault(lane, deque()).append(weakref.ref(stream))
        return stream

    def _release(self, state: _Engine) -> None:
        state.running -= 1
        while state.running < state.slots and state.waiting:
            lane, queue = next(iter(state.waiting.items()))
            waiter = queue.popleft()()
            if queue:
                state.waiting.move_to_end(lane)  # the next lane's turn
            else:
                del state.waiting[lane]
            if waiter is not None:
                state.running += 1
                waiter.grant()

    def _withdraw(self, stream: _GatedStream) -> None:
        queue = stream.state.waiting.get(stream.lane)
        if queue is None:
            return
        for ref in list(queue):
            if ref() is stream or ref() is None:
                queue.remove(ref)
        if not queue:
            del stream.state.waiting[stream.lane]


class _GatedStream:
    """A generation behind the gate: waits for its slot on first read (a cancel meanwhile
    ends it `cancelled` without reaching the engine), then reads the engine's stream;
    gives the slot back once it ends or is closed."""

    def __init__(
        self,
        gate: AdmissionGate,
        state: _Engine,
        lane: str,
        start: Callable[[], GenerationStream],
        prompt_tokens: int,
        inner: GenerationStream | None,
    ) -> None:
        self.gate = gate
        self.state = state
        self.lane = lane
        self._start = start
        self._prompt_tokens = prompt_tokens
        self._inner = inner
        self._holds = inner is not None  # a slot is this stream's
        self._turn = asyncio.Event()
        self._cancelled = False
        self._ended = False

    def grant(self) -> None:
        self._holds = True
        self._turn.set()

    def _give_back(self) -> None:
        if self._holds:
            self._holds = False
            self.gate._release(self.state)

    def __aiter__(self) -> _GatedStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        if self._ended:
            raise StopAsyncIteration
        if self._inner is None:
            await self._turn.wait()
            if self._cancelled:
                return self._end(GenerationDone("cancelled", self._prompt_tokens, 0))
            try:
                self._inner = self._start()
            except EngineBusy as exc:
                error = f"the server is overloaded: {exc}"
                return self._end(GenerationDone("error", self._prompt_tokens, 0, error=error))
        try:
            event = await self._inner.__anext__()
        except BaseException:
            self._give_back()
            raise
        if isinstance(event, GenerationDone):
            self._give_back()
        return event

    def _end(self, done: GenerationDone) -> GenerationDone:
        self._ended = True
        self._give_back()
        return done

    def cancel(self) -> None:
        if self._inner is not None:
            self._inner.cancel()
            return
        self._cancel_waiting()
        self._turn.set()

    def wrap_up(self) -> bool:
        if self._inner is not None:
            return self._inner.wrap_up()
        self.cancel()
        return False

    async def aclose(self) -> None:
        try:
            if self._inner is not None:
                await self._inner.aclose()
            else:
                self._cancel_waiting()
        finally:
            self._give_back()

    def _cancel_waiting(self) -> None:
        if not self._cancelled and not self._ended:
            self.state.cancelled += 1
        self._cancelled = True
        self.gate._withdraw(self)

    def __del__(self) -> None:  # a stream dropped unread still frees its slot
        self._give_back()
