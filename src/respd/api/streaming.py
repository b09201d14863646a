"""Server-sent events and client-disconnect handling.

A generation belongs to the client that asked for it: when the client goes away we close
the event iterator at once, which cancels the engine's work (see `engines/base.py`).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.abc
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from respd.protocol.errors import APIError

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its non-streaming answer was ready."""


def sse_frame(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


KEEPALIVE = b": keep-alive\n\n"

_encode_string = json.JSONEncoder(ensure_ascii=False).encode


class DeltaFrames:
    """SSE frames of one stream's deltas: events whose JSON differs only in one string
    field (the token text) and, optionally, one integer (the sequence number).

    The first event is serialised whole, with markers in those places, and split around
    them; every later frame is the pieces joined around the new values, so a token costs
    one string encode instead of a model validation and a full dump."""

    TEXT = "\u2063respd-text\u2063"
    NUMBER = 7_390_581_026_473

    def __init__(self, sample: dict[str, Any], event: str | None = None) -> None:
        """`sample`: the event's JSON with `TEXT` (and perhaps `NUMBER`) in place."""
        whole = sse_frame(sample, event).decode()
        text, number = _encode_string(self.TEXT), str(self.NUMBER)
        pieces = re.split(f"({re.escape(text)}|{number})", whole)
        if pieces.count(text) != 1 or pieces.count(number) > 1:
            raise ValueError("the sample must hold the text marker once, the number at most once")
        self._parts = [p.encode() for p in pieces[::2]]
        self._number_first = pieces[1] == number

    def frame(self, text: str, number: int = 0) -> bytes:
        encoded = _encode_string(text).encode()
        parts = self._parts
        if len(parts) == 2:
            return parts[0] + encoded + parts[1]
        values = (str(number).encode(), encoded)
        if not self._number_first:
            values = values[::-1]
        return parts[0] + values[0] + parts[1] + values[1] + parts[2]


class EventStreamResponse(StreamingResponse):
    """`text/event-stream` that always closes its iterator, notices a disconnect even while
    no event is being written (e.g. a request still waiting in the engine queue), and sends
    a `: keep-alive` comment after `keepalive` quiet seconds so proxies and clients do not
    give up on a long wait (0 disables them).

    Frames go from the iterator straight to the connection: no queue, task switch or timer
    per frame. The keep-alive runs beside them and writes only after a quiet spell; every
    ASGI send writes its whole chunk before it yields, so a comment never splits a frame."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        keepalive: float = 0.0,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._source = content
        self._keepalive = keepalive
        self._on_close = on_close
        self._last_write = 0.0
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    async def _keep_alive(self, send: Send) -> None:
        clock = asyncio.get_running_loop().time  # the clock `_last_write` is read from
        wait = self._keepalive
        while True:
            await anyio.sleep(wait)
            quiet = clock() - self._last_write
            if quiet >= self._keepalive:
                await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
                self._last_write = clock()
                wait = self._keepalive
            else:
                wait = self._keepalive - quiet

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def watch_disconnect(cancel: anyio.CancelScope) -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    cancel.cancel()
                    return

        async def keep_alive(scope: anyio.CancelScope) -> None:
            with scope:
                await self._keep_alive(send)

        async def stream(tg: anyio.abc.TaskGroup) -> None:
            quiet = anyio.CancelScope()
            clock = asyncio.get_running_loop().time
            try:
                await send(
                    {
                        "type": "http.response.start",
                        "status": self.status_code,
                        "headers": self.raw_headers,
                    }
                )
                self._last_write = clock()
                if self._keepalive > 0:
                    tg.start_soon(keep_alive, quiet)
                async for frame in self._source:
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
                    self._last_write = clock()
                quiet.cancel()  # nothing may follow the end of the body
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except OSError:
                pass  # the client went away while we were writing
            finally:
                tg.cancel_scope.cancel()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_disconnect, tg.cancel_scope)
                tg.start_soon(stream, tg)
        finally:
            try:
                aclose = getattr(self._source, "aclose", None)
                if aclose is not None:
                    with anyio.CancelScope(shield=True):
                        await aclose()
            finally:
                if self._on_close is not None:
                    self._on_close()


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Run `work`, cancelling it if the client disconnects first (non-streaming requests)."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        raise ClientGone()
    return task.result()


def after_wait(
    request: Request,
    wait: Callable[[], Awaitable[object]],
    start: Callable[[], Awaitable[Response]],
    error: Callable[[APIError], bytes],
    on_close: Callable[[], None] | None = None,
) -> EventStreamResponse:
    """A stream that starts at once and keeps the connection alive while `wait` runs (a
    model loading), then carries the stream `start` opens; a refusal before that is the
    stream's own error frame (`error`), since its 200 has been sent."""

    async def frames() -> AsyncIterator[bytes]:
        try:
            await wait()
            inner = await start()
        except APIError as exc:
            yield error(exc)
            return
        assert isinstance(inner, EventStreamResponse)  # `start` opens a stream
        source = inner._source
        try:
            async for frame in source:
                yield frame
        finally:
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()
            if inner._on_close is not None:
                inner._on_close()

    keepalive = request.app.state.sse_keepalive
    return EventStreamResponse(frames(), keepalive=keepalive, on_close=on_close)
