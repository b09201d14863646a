"""One WebSocket's responses, whatever the socket library: lanes, limits, and the
histories the socket keeps for continuations.

A `response.create` goes to its lane, named by its `stream_id` (none: the default lane).
A lane runs its responses one after another, in the order they came; lanes run beside
each other, so one socket can hold several conversations, or fork one onto a new lane
(`previous_response_id` says what a response continues, `stream_id` only where it runs).
Every event of a response made on a named lane carries that `stream_id`.

The socket keeps each finished response that was not stored, whole, so it can be
continued by id for as long as the socket is open. A response that fails, before its
first event or after, takes the history it continued out of that cache with it: the
state it failed on is not reused, and continuing from it again is
`previous_response_not_found` (unless it was stored, when the store still has it).

A `response.steer` names a running response on any lane (`steering.py` says what it
does). A steered response's successor runs next on the same lane, before what waits there,
and carries that lane's `stream_id`; it is part of the create that began the chain, so it
takes no room of its own under the limits. Notices about queued input (pending, or not
committed) go on the lane of the response they concern; a steer refused on arrival belongs
to no lane and carries no `stream_id`.

Per socket, at most `SocketLimits.active_responses` responses may be waiting or running,
at most `streams` lanes may be busy at once, and the socket lives at most `max_age`
seconds; each limit refuses with its own error code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from respd.protocol.errors import APIError
from respd.protocol.responses import CreateResponseRequest
from respd.protocol.wire import wire
from respd.service.responses.service import EventStream, ResponsesService
from respd.service.responses.socket_limits import SocketLimits
from respd.service.responses.steering import Outcome, Steer, SteeringDesk, unsteerable
from respd.store.base import JSON

log = logging.getLogger(__name__)

# Sends one event (a JSON object) on the socket; raises `SocketClosed` once it is gone.
Send = Callable[[dict[str, Any]], Awaitable[None]]
# Reads a create body into the request model (400s named as for HTTP).
Validate = Callable[[dict[str, Any]], CreateResponseRequest]

# How many finished histories one socket keeps for continuations.
MAX_CACHED = 64

ACTIVE_LIMIT_CODE = "websocket_active_response_limit_reached"
STREAM_LIMIT_CODE = "websocket_stream_limit_reached"
AGE_LIMIT_CODE = "websocket_connection_limit_reached"


class SocketClosed(Exception):
    """The client went away: nothing more can be sent."""


def error_event(exc: APIError, stream_id: str | None = None) -> dict[str, Any]:
    """An `error` event: the HTTP status the same failure would have, OpenAI's error."""
    event: dict[str, Any] = {"type": "error", "status": exc.status_code, **exc.body()}
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event


def age_limit_error(max_age: float) -> APIError:
    return APIError(
        f"This WebSocket connection reached its limit of {max_age:g} seconds; open a new "
        "connection to continue.",
        status_code=400,
        code=AGE_LIMIT_CODE,
    )


@dataclass
class Create:
    """One `response.create`, as its lane will run it."""

    body: dict[str, Any]
    generate: bool = True


@dataclass
class _Lane:
    stream_id: str | None
    waiting: deque[Create] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


class SocketSession:
    """One socket's lanes, limits and continuation histories."""

    def __init__(
        self,
        service: ResponsesService,
        owner: str,
        send: Send,
        validate: Validate,
        limits: SocketLimits | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.service = service
        self.owner = owner
        self.limits = limits or SocketLimits()
        self.histories: OrderedDict[str, list[JSON]] = OrderedDict()
        self._send = send
        self._validate = validate
        self._clock = clock
        self._opened = clock()
        self._lanes: dict[str | None, _Lane] = {}
        self._active = 0
        self.steering = SteeringDesk()

    # -- limits ---------------------------------------------------------------------------

    @property
    def active(self) -> int:
        """Responses accepted on this socket and not finished (waiting or running)."""
        return self._active

    def age_left(self) -> float:
        """Seconds this socket may still live."""
        return self.limits.max_age - (self._clock() - self._opened)

    def _admit(self, stream_id: str | None) -> None:
        """Refuse a create the socket's limits leave no room for."""
        if self.age_left() <= 0:
            raise age_limit_error(self.limits.max_age)
        if self._active >= self.limits.active_responses:
            raise APIError(
                f"This connection already has {self._active} responses in flight, its "
                f"limit; wait for one to finish or open another connection.",
                status_code=429,
                code=ACTIVE_LIMIT_CODE,
                param="stream_id" if stream_id is not None else None,
            )
        if stream_id not in self._lanes and len(self._lanes) >= self.limits.streams:
            raise APIError(
                f"This connection already has {len(self._lanes)} busy streams, its limit; "
                "send on an existing stream_id or wait for one to finish.",
                status_code=429,
                code=STREAM_LIMIT_CODE,
                param="stream_id",
            )

    # -- lanes ----------------------------------------------------------------------------

    def submit(self, create: Create, stream_id: str | None = None) -> None:
        """Queue `create` on its lane (raising `APIError` when a limit refuses it); it runs
        once the responses queued before it on that lane have finished."""
        self._admit(stream_id)
        lane = self._lanes.get(stream_id)
        if lane is None:
            lane = self._lanes[stream_id] = _Lane(stream_id)
        lane.waiting.append(create)
        self._active += 1
        if lane.task is None:
            lane.task = asyncio.create_task(self._drive(lane))

    async def _drive(self, lane: _Lane) -> None:
        try:
            while lane.waiting:
                create = lane.waiting.popleft()
                try:
                    await self._chain(create, lane.stream_id)
                except SocketClosed:
                    return  # its generation stopped as its events closed
                except APIError as exc:
                    await self._send(error_event(exc, lane.stream_id))
                except Exception:
                    log.exception("a WebSocket response failed")
                    await self._send(
                        error_event(
                            APIError(
                                "The server had an error while processing your request.",
                                status_code=500,
                                error_type="server_error",
                                code="server_error",
                            ),
                            lane.stream_id,
                        )
                    )
                finally:
                    self._active -= 1
        finally:
            self._active -= len(lane.waiting)
            lane.waiting.clear()
            self._lanes.pop(lane.stream_id, None)

    async def idle(self) -> None:
        """Wait until every lane has finished what it holds."""
        while self._lanes:
            tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
            await asyncio.wait(tasks)

    async def close(self) -> None:
        """Stop every lane: running responses are cancelled (their generation stops)."""
        tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- steering -------------------------------------------------------------------------

    async def steer(self, message: dict[str, Any]) -> None:
        """Queue a `response.steer` on the running response it names, on whichever lane
        (acknowledged in that response's stream), or send the event that refuses it."""
        refusal = self.steering.submit(message)
        if refusal is not None:
            await self._send(refusal)

    async def _chain(self, create: Create, stream_id: str | None) -> None:
        """Run a create, then each successor its steering input makes, on the same lane."""
        steers: list[Steer] = []
        while True:
            try:
                outcome = await self.respond(create, stream_id)
            except APIError as exc:
                if not steers:
                    raise
                for refusal in self.steering.not_committed(steers, exc.message):
                    await self._send(_on_lane(refusal, stream_id))
                return
            for notice in outcome.notices:
                await self._send(_on_lane(notice, stream_id))
            if outcome.successor is None:
                return
            create, steers = Create(outcome.successor), outcome.steers

    # -- one response ---------------------------------------------------------------------

    async def respond(self, create: Create, stream_id: str | None = None) -> Outcome:
        """Run one create and send its events: what its steering input makes of it. A
        failure evicts the history it continued from this socket (raised `APIError`s are
        the caller's to send)."""
        body = self.steering.unpark(create.body)  # input queued while a tool call was owed
        previous = body.get("previous_response_id")
        previous = previous if isinstance(previous, str) else None
        try:
            req, created = await self._start(body, previous, create.generate)
        except APIError:
            self._evict(previous)
            raise
        machine = created.machine
        target = None
        if machine is not None:
            target = self.steering.track(body, machine, unsteerable(req))
        try:
            async with aclosing(created.events) as events:
                async for event in events:
                    payload = event if isinstance(event, dict) else wire(event)
                    await self._send(_on_lane(payload, stream_id))
        except BaseException:
            if target is not None:
                self.steering.ended(target)  # no longer a target; its input goes with it
            raise
        if machine is not None and machine.status == "failed":
            self._evict(previous)
        self._keep(created)
        return self.steering.ended(target) if target is not None else Outcome()

    async def _start(
        self, body: dict[str, Any], previous: str | None, generate: bool
    ) -> tuple[CreateResponseRequest, EventStream]:
        """Validate and admit one create: its request and `EventStream`."""
        prior = self.histories.get(previous) if previous is not None else None
        if prior is not None:
            # Continued from this socket's own history: stored or not, no store read.
            new = body.get("input")
            items = (
                [{"type": "message", "role": "user", "content": new}]
                if isinstance(new, str)
                else list(new or [])
            )
            body = {**body, "input": [*prior, *items], "previous_response_id": None}
        req = self._validate(body)
        continues = previous if prior is not None else None
        if not generate:
            return req, await self.service.prewarm(req, self.owner, continues=continues)
        return req, await self.service.create(req, self.owner, stream=True, continues=continues)

    def _keep(self, created: EventStream) -> None:
        """A finished response that was not stored is continued from here alone."""
        kept = created.continuation()
        if kept is None:
            return
        response_id, history = kept
        self.histories[response_id] = history
        while len(self.histories) > MAX_CACHED:
            self.histories.popitem(last=False)

    def _evict(self, response_id: str | None) -> None:
        if response_id is not None and self.histories.pop(response_id, None) is not None:
            log.info("evicted %s from a socket's cache: its continuation failed", response_id)


def _on_lane(event: dict[str, Any], stream_id: str | None) -> dict[str, Any]:
    """An event as a laned response sends it: naming its lane."""
    return event if stream_id is None else {**event, "stream_id": stream_id}
