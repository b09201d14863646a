"""Steering over HTTP: `POST /v1/responses/{id}/steer` reaches a response streaming on
another request of the same owner.

The SDK sends `response.steer` over a WebSocket only; a client on plain HTTP gets the same
behaviour through this route. The steer is checked and queued as on a socket
(`steering.py`): the target's stream carries `response.steer.accepted`, stops at its next
safe boundary and ends `incomplete` (reason `steered`); the successor response then runs
on, in the same SSE stream, its events after the steered response's terminal event. Input
that waits for a client's tool output comes back as `response.steer.pending` at the end of
the stream, and goes ahead of the input of the create that continues that response.

Only streamed responses can be steered here: a response returned whole has no stream for
the successor, and a background one none of its own (as on a socket).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

from openai.types.responses.response_steer_accepted_event import Steer as AcceptedSteer

from respd.protocol.errors import APIError
from respd.protocol.responses import CreateResponseRequest
from respd.service.responses.events import ResponseEventMachine
from respd.service.responses.service import EventStream, ResponsesService
from respd.service.responses.steering import SteeringDesk, SteerRefused, unsteerable
from respd.store.base import JSON

# A refusal's HTTP status, by its steering error code.
STATUS = {
    "response_not_found": 404,
    "invalid_input": 400,
    "steering_not_supported": 400,
    "too_many_pending_steers": 429,
    "response_already_completed": 409,
    "response_not_active": 409,
}

Validate = Callable[[JSON], CreateResponseRequest]


class SteerableStreams:
    """The streamed HTTP responses steering can reach: one desk per owner, so a steer
    never reaches another owner's response."""

    def __init__(self, service: ResponsesService) -> None:
        self.service = service
        self._desks: defaultdict[str, SteeringDesk] = defaultdict(SteeringDesk)

    def unpark(self, owner: str, body: JSON) -> JSON:
        """A create continuing a response whose steering input waits: that input first."""
        desk = self._desks.get(owner)
        return body if desk is None else desk.unpark(body)

    def steer(self, owner: str, response_id: str, body: Any) -> JSON:
        """Queue steering input on the running response, or raise the refusal as an
        `APIError` (its steering code, and a status that fits it)."""
        if not isinstance(body, dict):
            raise _refused(SteerRefused("invalid_input", "The body must be a JSON object."))
        message = {"type": "response.steer", "previous_response_id": response_id, **body}
        try:
            steer = self._desks[owner].queue(message)
        except SteerRefused as exc:
            raise _refused(exc) from exc
        accepted = AcceptedSteer(id=steer.id, previous_response_id=steer.target)
        return {"object": "response.steer", **accepted.model_dump()}

    def events(
        self,
        owner: str,
        body: JSON,
        req: CreateResponseRequest,
        created: EventStream,
        validate: Validate,
    ) -> AsyncGenerator[Any, None]:
        """`created`'s events, then those of each successor its steering input makes."""
        return self._chain(owner, body, req, created.machine, created.events, validate)

    async def _chain(
        self,
        owner: str,
        body: JSON,
        req: CreateResponseRequest,
        machine: ResponseEventMachine | None,
        events: AsyncGenerator[Any, None],
        validate: Validate,
    ) -> AsyncGenerator[Any, None]:
        desk = self._desks[owner]
        while True:
            target = desk.track(body, machine, unsteerable(req)) if machine else None
            try:
                async with aclosing(events):
                    async for event in events:
                        yield event
            finally:
                outcome = desk.ended(target) if target is not None else None
            if outcome is None:
                return
            for notice in outcome.notices:
                yield notice
            if outcome.successor is None:
                return
            body = outcome.successor
            try:
                req = validate(body)
                created = await self.service.create(req, owner, stream=True)
            except APIError as exc:
                for refusal in desk.not_committed(outcome.steers, exc.message):
                    yield refusal
                return
            machine, events = created.machine, created.events


def _refused(exc: SteerRefused) -> APIError:
    return APIError(
        exc.message,
        status_code=STATUS.get(exc.code, 400),
        code=exc.code,
        param="input" if exc.code == "invalid_input" else None,
    )
