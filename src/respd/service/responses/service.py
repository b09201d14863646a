"""`POST /v1/responses` and its siblings, whatever the transport: which course a create
takes (a compaction turn, a background job, or a response generated for its caller), and
what the transport is handed to frame: the finished Response, or the stream of its events."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal, overload

from openai.types.responses import ResponseStreamEvent

from respd.protocol.errors import UpstreamFailed
from respd.protocol.input_tokens import InputTokensRequest
from respd.protocol.responses import CreateResponseRequest
from respd.protocol.wire import wire
from respd.service.responses.background import BackgroundJobs
from respd.service.responses.compaction import Compactor, CompactRequest, compaction_turn
from respd.service.responses.ending import always_ended
from respd.service.responses.events import ResponseEventMachine
from respd.service.responses.prewarm import prewarm, wants_prewarm
from respd.service.responses.runner import ResponseRunner, Turn
from respd.service.responses.stored import StoredResponses
from respd.service.shared import Shared
from respd.store.base import DEFAULT_JOB_LEASE_SECS, JSON

# Runs a non-streamed response's work for its transport, which may cancel it (its client
# went away).
Guard = Callable[[Awaitable[JSON]], Awaitable[JSON]]


@dataclass
class Answer:
    """A create that was not streamed: the finished Response (queued, for a background one)."""

    response: JSON


@dataclass
class EventStream:
    """A streamed create: its events, the live ones as SDK objects, a background job's as
    the JSON of its log. Closing `events` cancels the generation, except a background
    job's, which outlives its client: closing then stops only the follow."""

    events: AsyncGenerator[ResponseStreamEvent | JSON, None]
    turn: Turn | None = None
    machine: ResponseEventMachine | None = None
    # Gives back the caller's slot of concurrent work; closing `events` calls it too.
    release: Callable[[], None] = lambda: None

    def continuation(self) -> tuple[str, list[JSON]] | None:
        """Once the events ran out: the id and whole history of a finished response that
        was not stored, which only whoever keeps that history can continue."""
        turn, machine = self.turn, self.machine
        if turn is None or machine is None or turn.stored:
            return None
        if machine.status not in ("completed", "incomplete"):
            return None
        return machine.id, [*turn.history.items, *turn.input_items, *machine.output]


async def released(
    events: AsyncGenerator[Any, None], release: Callable[[], None]
) -> AsyncGenerator[Any, None]:
    """`events`, calling `release` once they end or are closed."""
    try:
        async with aclosing(events):
            async for event in events:
                yield event
    finally:
        release()


async def _drain(events: AsyncGenerator[Any, None]) -> None:
    async with aclosing(events):
        async for _ in events:
            pass


class ResponsesService:
    """Creates responses (generated, compacted or in the background), compacts histories,
    counts input tokens; `stored` answers for responses by id."""

    def __init__(self, shared: Shared, *, lease_secs: float = DEFAULT_JOB_LEASE_SECS) -> None:
        self.models = shared.models
        self.quotas = shared.quotas
        self.store = shared.store
        self.runner = ResponseRunner(shared)
        self.jobs = BackgroundJobs(self.runner, shared.store, lease_secs=lease_secs)
        self.stored = StoredResponses(shared.store, self.jobs)

    async def open(self) -> None:
        """Take up background work (see `BackgroundJobs.open`)."""
        await self.jobs.open()

    async def shutdown(self) -> None:
        """Stop every background job (see `BackgroundJobs.shutdown`)."""
        await self.jobs.shutdown()

    @overload
    async def create(
        self,
        req: CreateResponseRequest,
        owner: str,
        *,
        stream: Literal[True],
        continues: str | None = None,
    ) -> EventStream: ...

    @overload
    async def create(
        self,
        req: CreateResponseRequest,
        owner: str,
        *,
        until: Guard | None = None,
    ) -> Answer | EventStream: ...

    async def create(
        self,
        req: CreateResponseRequest,
        owner: str,
        *,
        stream: bool | None = None,
        until: Guard | None = None,
        continues: str | None = None,
    ) -> Answer | EventStream:
        """A response for `req` (streamed when `stream`, by default as `req.stream` asks).
        A bad request, or a full engine (503), raises now, before any event; an upstream
        engine's failure of a response that is not streamed raises `UpstreamFailed` with
        its status. `until` runs a non-streamed response's work (the transport cancels
        it when its client goes away, which stops the generation); `continues` names the
        response whose history the input already carries, for its echo.

        Every create counts against its owner's rates (429), whatever the transport; a
        stream or a background job holds one of its owner's slots until it ends."""
        streamed = bool(req.stream if stream is None else stream)
        self.quotas.admit(owner)
        if req.store is not False:
            await self.quotas.check_storage(self.store, owner)
        if not (streamed or req.background):
            return await self._create(req, owner, streamed, until, continues)
        release = self.quotas.hold(owner, background=bool(req.background))
        try:
            created = await self._create(req, owner, streamed, until, continues, release)
        except BaseException:
            release()
            raise
        if isinstance(created, EventStream) and not req.background:
            created.events = released(created.events, release)
            created.release = release
        return created

    async def _create(
        self,
        req: CreateResponseRequest,
        owner: str,
        streamed: bool,
        until: Guard | None,
        continues: str | None,
        release: Callable[[], None] | None = None,
    ) -> Answer | EventStream:
        turn: Turn
        if wants_prewarm(req):
            turn, machine, events = await prewarm(self.runner, req, owner)
        elif compaction_turn(req.input):
            run = await Compactor(self.runner).start(req, owner)
            turn, machine, events = run.turn, run.machine, run.events
        else:
            prepared = await self.runner.prepare(req, owner, stream_compaction=True)
            if req.background:
                job = await self.jobs.start(prepared, release)
                if streamed:
                    return EventStream(job.follow(after=-1))
                return Answer(wire(job.machine.snapshot()))
            turn, machine = prepared, prepared.machine()
            events = self.runner.respond(prepared, machine)  # admission: a 503 raises here
        if continues is not None:
            machine.echo["previous_response_id"] = continues
        events = always_ended(events, machine)
        if streamed:
            return EventStream(events, turn, machine)
        work = self._finished(machine, events)
        return Answer(await (until(work) if until is not None else work))

    async def prewarm(
        self, req: CreateResponseRequest, owner: str, *, continues: str | None = None
    ) -> EventStream:
        """A response prepared without output (`generate: false`): its state kept as any
        response's and its prompt warmed in the engine's cache (see `prewarm.py`)."""
        turn, machine, events = await prewarm(self.runner, req, owner)
        if continues is not None:
            machine.echo["previous_response_id"] = continues
        return EventStream(events, turn, machine)

    async def _finished(
        self, machine: ResponseEventMachine, events: AsyncGenerator[ResponseStreamEvent, None]
    ) -> JSON:
        """Run the response to its end: its Response, or its upstream engine's failure."""
        await _drain(events)
        if machine.error_status is not None and machine.error is not None:
            # An upstream's refusal or failure keeps its status (the response is stored failed).
            raise UpstreamFailed(machine.error["message"], machine.error_status)
        return wire(machine.snapshot())

    async def compact(self, body: CompactRequest, owner: str) -> dict[str, Any]:
        """`POST /v1/responses/compact`: the history summarised into one compaction item."""
        return await Compactor(self.runner).compact(body, owner)

    async def count_input_tokens(self, body: InputTokensRequest, owner: str) -> int:
        """The prompt `create` would send the engine for this body, counted exactly (the
        same `prepare`, so it equals the created response's `usage.input_tokens`)."""
        # Only the fields a count takes; anything else in the body is ignored, as by create.
        ignored = {"personality", *(body.model_extra or {})}
        fields = body.model_dump(exclude_none=True, by_alias=True, exclude=ignored)
        fields["model"] = body.model or self.models.default_id()
        req = CreateResponseRequest.model_validate(fields)
        prepared = await self.runner.prepare(req, owner, counting=True)
        return prepared.prompt_tokens
