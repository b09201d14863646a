"""WebSocket mode of `/v1/responses`: one socket, many responses.

The client sends `{"type": "response.create", ...create body}` messages; each answers with
the same typed events the HTTP stream sends, one JSON message per event. `stream_id` puts
a response on a lane: a lane's responses run one after another, lanes run side by side,
and each event of a laned response carries its `stream_id`. `generate: false` prepares a
turn without output. A `response.steer` adds user input to a running response, on whatever
lane it runs. How lanes, limits, steering and the socket's continuation cache behave is the
service's (`service/responses/socket.py`); this module reads messages and frames events.

A response is always streamed here and never in the background: `stream: false`, any
`stream_options` and `background: true` are refused, naming the field (`stream: true`,
which Codex sends, is what the socket does anyway). A bad message is an `error` event
(`{"type": "error", "status", "error": {...}}`), never the end of the socket. Keys are
checked as for HTTP, before the socket is accepted. At its age limit the socket says so
in an `error` event, once its responses have finished, and closes.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from respd.api.body import load_json, validate_object
from respd.api.identity import owner_of
from respd.protocol.errors import APIError, InvalidRequest
from respd.protocol.responses import CreateResponseRequest
from respd.service.responses.socket import (
    Create,
    SocketClosed,
    SocketLimits,
    SocketSession,
    age_limit_error,
    error_event,
)

router = APIRouter()

# The SDK's rule for a lane's name.
STREAM_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")
MESSAGE_TYPES = ("response.create", "response.steer")
# Closing the socket at its age limit: a normal closure, after the error event says why.
AGE_CLOSE_CODE = 1000


def _reject_http_only(message: dict[str, Any]) -> None:
    """Fields that only mean something over HTTP, where they would change the course."""
    stream = message.get("stream")
    if stream is not None and stream is not True:
        raise InvalidRequest(
            "'stream' is not supported over WebSocket: responses are always streamed.",
            param="stream",
            code="unsupported_parameter",
        )
    if message.get("stream_options") is not None:
        raise InvalidRequest(
            "'stream_options' is not supported over WebSocket.",
            param="stream_options",
            code="unsupported_parameter",
        )
    background = message.get("background")
    if background is not None and background is not False:
        raise InvalidRequest(
            "'background' is not supported over WebSocket; use POST /v1/responses.",
            param="background",
            code="unsupported_parameter",
        )


def _stream_id(message: dict[str, Any]) -> str | None:
    stream_id = message.get("stream_id")
    if stream_id is None:
        return None
    if not isinstance(stream_id, str) or not STREAM_ID.fullmatch(stream_id):
        raise InvalidRequest(
            "Invalid 'stream_id': expected 1 to 256 ASCII letters, digits, underscores, "
            "hyphens or periods.",
            param="stream_id",
            code="invalid_value",
        )
    return stream_id


def read_message(raw: str | bytes) -> dict[str, Any]:
    """A client message: a `response.create` or a `response.steer` event."""
    message = load_json(raw.encode() if isinstance(raw, str) else raw)
    if not isinstance(message, dict) or message.get("type") not in MESSAGE_TYPES:
        kind = message.get("type") if isinstance(message, dict) else None
        raise InvalidRequest(
            f"Unsupported message type {kind!r}: send 'response.create' or 'response.steer'.",
            param="type",
            code="invalid_value",
        )
    return message


def parse_create(message: dict[str, Any]) -> Create:
    """A `response.create` message's create body, and whether to generate."""
    _reject_http_only(message)
    generate = message.get("generate", True)
    if generate is None:
        generate = True
    if not isinstance(generate, bool):
        raise InvalidRequest(
            "Invalid type for 'generate': expected a boolean.",
            param="generate",
            code="invalid_type",
        )
    skip = {"type", "stream_id", "generate", "stream", "stream_options", "background"}
    body = {k: v for k, v in message.items() if k not in skip}
    return Create(body, generate)


def _validate(body: dict[str, Any]) -> CreateResponseRequest:
    return validate_object(body, CreateResponseRequest, "websocket /v1/responses")


class SocketEvents:
    """Sends events on one socket: the lanes' sends never interleave within a message."""

    def __init__(self, socket: WebSocket) -> None:
        self.socket = socket
        self._lock = asyncio.Lock()

    async def send(self, event: dict[str, Any]) -> None:
        async with self._lock:
            try:
                await self.socket.send_json(event)
            except (WebSocketDisconnect, RuntimeError, OSError) as exc:
                # Starlette raises RuntimeError for a send after the close.
                raise SocketClosed(str(exc)) from exc


def socket_limits(socket: WebSocket) -> SocketLimits:
    limits = getattr(socket.app.state, "socket_limits", None)
    return limits if isinstance(limits, SocketLimits) else SocketLimits()


@router.websocket("/v1/responses")
@router.websocket("/responses")
async def responses_socket(socket: WebSocket) -> None:
    await socket.accept()
    events = SocketEvents(socket)
    session = SocketSession(
        socket.app.state.responses,
        owner_of(socket),
        events.send,
        _validate,
        socket_limits(socket),
    )
    try:
        await _serve(socket, session, events)
    except (WebSocketDisconnect, SocketClosed):
        return
    finally:
        await session.close()


async def _serve(socket: WebSocket, session: SocketSession, events: SocketEvents) -> None:
    while True:
        try:
            message = await asyncio.wait_for(socket.receive(), max(session.age_left(), 0))
        except TimeoutError:
            await session.idle()  # what is in flight finishes first
            await events.send(error_event(age_limit_error(session.limits.max_age)))
            await socket.close(AGE_CLOSE_CODE)
            return
        if message["type"] == "websocket.disconnect":
            return
        raw = message.get("text") if message.get("text") is not None else message.get("bytes")
        if raw is None:
            continue
        stream_id: str | None = None
        try:
            message = read_message(raw)
            if message["type"] == "response.steer":
                await session.steer(message)  # answered in its target's stream, or refused
                continue
            stream_id = _stream_id(message)  # named on every error that follows
            session.submit(parse_create(message), stream_id)
        except APIError as exc:
            await events.send(error_event(exc, stream_id))
