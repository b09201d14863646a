"""Server-sent events and client-disconnect handling.

A generation belongs to the client that asked for it: when the client goes away we close
the event iterator at once, which cancels the engine's work (see `engines/base.py`).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its non-streaming answer was ready."""


def sse_frame(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


KEEPALIVE = b": keep-alive\n\n"


class EventStreamResponse(StreamingResponse):
    """`text/event-stream` that always closes its iterator, notices a disconnect even while
    no event is being written (e.g. a request still waiting in the engine queue), and sends
    a `: keep-alive` comment after `keepalive` quiet seconds so proxies and clients do not
    give up on a long wait (0 disables them)."""

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
        self._send_ch, self._recv_ch = anyio.create_memory_object_stream[bytes](math.inf)
        super().__init__(
            self._frames(),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    async def _pump(self) -> None:
        async with self._send_ch:
            async for frame in self._source:
                await self._send_ch.send(frame)

    async def _frames(self) -> AsyncIterator[bytes]:
        async with self._recv_ch:
            while True:
                with anyio.move_on_after(self._keepalive or math.inf) as quiet:
                    try:
                        frame = await self._recv_ch.receive()
                    except anyio.EndOfStream:
                        return
                if quiet.cancelled_caught:
                    yield KEEPALIVE
                else:
                    yield frame

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def watch_disconnect(cancel: anyio.CancelScope) -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    cancel.cancel()
                    return

        async def stream(cancel: anyio.CancelScope) -> None:
            try:
                await self.stream_response(send)
            except OSError:
                pass  # the client went away while we were writing
            finally:
                cancel.cancel()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_disconnect, tg.cancel_scope)
                tg.start_soon(self._pump)
                tg.start_soon(stream, tg.cancel_scope)
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
