"""WebSocket mode of `/v1/responses`: one socket, many responses.

The client sends `{"type": "response.create", ...create body}` messages; each answers with
the same typed events the HTTP stream sends, one JSON message per event, in order. The
responses on a socket run one after another, off the reading loop: a `response.steer` sent
while one runs reaches it (`service/responses/steering.py`). A response made on this socket can be
continued with `previous_response_id` even when it was not stored (`store: false`): the
socket keeps each finished unstored response's whole history for as long as it is open. After a
reconnect, or from a response that failed, that history is gone and the continuation is a
`previous_response_not_found` error, unless the response was stored. A bad message is an
`error` event (`{"type": "error", "status", "error": {...}}`), never the end of the socket.
Keys are checked as for HTTP, before the socket is accepted.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from respd.api.body import load_json, validate_object
from respd.api.identity import owner_of
from respd.protocol.errors import APIError, InvalidRequest
from respd.protocol.responses import CreateResponseRequest
from respd.protocol.wire import wire
from respd.service.responses.service import ResponsesService
from respd.service.responses.steering import Outcome, Steer, SteeringDesk, unsteerable
from respd.store.base import JSON

log = logging.getLogger(__name__)
router = APIRouter()

# Fields of a create body that mean something only over HTTP.
_TRANSPORT_FIELDS = ("type", "stream", "stream_options", "background")
# How many finished histories one socket keeps for continuations.
MAX_CACHED = 64


def error_event(exc: APIError) -> dict[str, Any]:
    return {"type": "error", "status": exc.status_code, **exc.body()}


class SocketSession:
    """One socket's responses and the histories they leave for continuations."""

    def __init__(self, socket: WebSocket, service: ResponsesService, owner: str) -> None:
        self.socket = socket
        self.service = service
        self.owner = owner
        self.histories: dict[str, list[JSON]] = {}
        self.steering = SteeringDesk()
        self._sending = asyncio.Lock()
        # Creates run one after another, off the reading loop, so a steer is read while a
        # response runs.
        self._last: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def send(self, event: dict[str, Any]) -> None:
        async with self._sending:
            await self.socket.send_json(event)

    async def handle(self, raw: str | bytes) -> None:
        try:
            message = load_json(raw.encode() if isinstance(raw, str) else raw)
            kind = message.get("type") if isinstance(message, dict) else None
            if kind == "response.steer":
                refusal = self.steering.submit(message)
                if refusal is not None:
                    await self.send(refusal)
                return
            if kind != "response.create":
                raise InvalidRequest(
                    f"Unsupported message type {kind!r}: send 'response.create' or "
                    "'response.steer'.",
                    param="type",
                    code="invalid_value",
                )
        except APIError as exc:
            await self.send(error_event(exc))
            return
        self._last = asyncio.create_task(self._after(self._last, message))
        self._tasks.add(self._last)
        self._last.add_done_callback(self._tasks.discard)

    async def _after(self, before: asyncio.Task[None] | None, message: JSON) -> None:
        if before is not None:
            await asyncio.wait([before])
        body = {k: v for k, v in message.items() if k not in _TRANSPORT_FIELDS}
        try:
            await self._create(self.steering.unpark(body))
        except APIError as exc:
            await self.send(error_event(exc))
        except WebSocketDisconnect:
            return
        except Exception:
            log.exception("websocket response failed")
            await self.socket.close(code=1011)

    async def close(self) -> None:
        """The socket went away: stop what runs (closing its events stops the generation)."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)

    async def _create(self, body: JSON) -> None:
        """Run a response, then each successor its steering input makes."""
        steers: list[Steer] = []
        successor: JSON | None = body
        while successor is not None:
            try:
                outcome = await self._respond(successor)
            except APIError as exc:
                if not steers:
                    raise
                for refusal in self.steering.not_committed(steers, exc.message):
                    await self.send(refusal)
                return
            for notice in outcome.notices:
                await self.send(notice)
            successor, steers = outcome.successor, outcome.steers

    async def _respond(self, body: JSON) -> Outcome:
        prior: list[JSON] = []
        previous = body.get("previous_response_id")
        if isinstance(previous, str) and previous in self.histories:
            # Continued from this socket's own history: stored or not, no store read.
            prior = self.histories[previous]
            new = body.get("input")
            items = (
                [{"type": "message", "role": "user", "content": new}]
                if isinstance(new, str)
                else list(new or [])
            )
            body = {**body, "input": [*prior, *items], "previous_response_id": None}
        req = validate_object(body, CreateResponseRequest, "websocket /v1/responses")
        created = await self.service.create(
            req, self.owner, stream=True, continues=previous if prior else None
        )
        target = None
        if created.machine is not None:
            target = self.steering.track(body, created.machine, unsteerable(req))
        async with aclosing(created.events) as events:
            async for event in events:
                await self.send(event if isinstance(event, dict) else wire(event))
        # A stored response is continued from the store like over HTTP; an unstored one
        # only from here.
        kept = created.continuation()
        if kept is not None:
            response_id, history = kept
            self.histories[response_id] = history
            while len(self.histories) > MAX_CACHED:
                self.histories.pop(next(iter(self.histories)))
        return self.steering.ended(target) if target is not None else Outcome()


@router.websocket("/v1/responses")
@router.websocket("/responses")
async def responses_socket(socket: WebSocket) -> None:
    await socket.accept()
    session = SocketSession(socket, socket.app.state.responses, owner_of(socket))
    try:
        while True:
            message = await socket.receive()
            if message["type"] == "websocket.disconnect":
                return
            raw = message.get("text") if message.get("text") is not None else message.get("bytes")
            if raw is not None:
                await session.handle(raw)
    except WebSocketDisconnect:
        return
    finally:
        await session.close()
