"""uvicorn's HTTP/1.1 protocols with deadlines for the request head and body.

uvicorn bounds an idle keep-alive connection but not one that is opened and never sends
a complete request line and headers, nor one that announces a body and sends it a byte at
a time: each such connection would hold a socket, a file descriptor and a waiting route
for as long as the client likes. Here a connection must deliver a whole request head
within `header_timeout` seconds of opening, or of the first byte of its next request on a
kept-alive connection, or it is closed. A body must then arrive within `body_timeout`
seconds, or keep coming at `min_body_rate` bytes a second or more over each such period
(a large upload on a good link takes as long as it needs); else the client is answered
408 (when no answer has started) and the connection is closed.

Both of uvicorn's parsers get the deadline: httptools (C, llhttp), used where installed
because it writes a streamed body with far less Python per frame, and h11 otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is not installed: h11 serves alone
    HttpToolsProtocol = None  # type: ignore[assignment,misc]


class _HeadTimer:
    """The deadline of one connection's request head."""

    def __init__(self) -> None:
        self.handle: asyncio.TimerHandle | None = None

    def arm(
        self, loop: asyncio.AbstractEventLoop, seconds: float, expire: Callable[[], None]
    ) -> None:
        if self.handle is None and seconds > 0:
            self.handle = loop.call_later(seconds, expire)

    def disarm(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


REQUEST_TIMEOUT_BODY = (
    b'{"error":{"message":"The request body did not arrive in time.",'
    b'"type":"invalid_request_error","param":null,"code":"request_timeout"}}'
)
REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n"
    % len(REQUEST_TIMEOUT_BODY)
    + REQUEST_TIMEOUT_BODY
)


class _BodyTimer:
    """The deadline of one request's body: every `seconds` it must have completed, or have
    brought at least `min_rate` bytes a second since the last check."""

    def __init__(self) -> None:
        self.handle: asyncio.TimerHandle | None = None
        self.received = 0

    def arm(
        self,
        loop: asyncio.AbstractEventLoop,
        seconds: float,
        min_rate: float,
        expire: Callable[[], None],
    ) -> None:
        self.disarm()
        if seconds <= 0:
            return
        self.received = 0

        def check() -> None:
            if min_rate > 0 and self.received >= min_rate * seconds:
                self.received = 0
                self.handle = loop.call_later(seconds, check)
                return
            self.handle = None
            expire()

        self.handle = loop.call_later(seconds, check)

    def disarm(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


def _time_out_body(protocol: Any) -> None:
    """Answer 408 when the route has not started an answer, and close the connection; the
    route reading the body sees the client gone."""
    transport = protocol.transport
    if transport.is_closing() or transport.get_protocol() is not protocol:
        return  # gone, or upgraded to a WebSocket, which bounds itself
    protocol.logger.debug("closing a connection whose request body stalled")
    cycle = getattr(protocol, "cycle", None)
    if cycle is not None and not cycle.response_started:
        transport.write(REQUEST_TIMEOUT)
    transport.close()


class HeaderTimeoutProtocol(H11Protocol):
    """`H11Protocol` that closes a connection whose request head is not complete in time;
    subclass it with `header_timeout_protocol` to set the deadline."""

    header_timeout: float  # seconds; set by `header_timeout_protocol`
    body_timeout: float = 0.0
    min_body_rate: float = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head = _HeadTimer()
        self._body = _BodyTimer()
        super().connection_made(transport)
        self._head.arm(self.loop, self.header_timeout, self._expire)

    def data_received(self, data: bytes) -> None:
        before = self.conn.their_state
        if before is h11.IDLE:
            # The head of a kept-alive connection's next request begins.
            self._head.arm(self.loop, self.header_timeout, self._expire)
        elif before is h11.SEND_BODY:
            self._body.received += len(data)
        super().data_received(data)
        after = self.conn.their_state
        if after is not h11.IDLE:
            self._head.disarm()  # a whole head arrived: the request has begun
        if after is h11.SEND_BODY and before is not h11.SEND_BODY:
            self._body.arm(self.loop, self.body_timeout, self.min_body_rate, self._stalled)
        elif after is not h11.SEND_BODY:
            self._body.disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head.disarm()
        self._body.disarm()
        super().connection_lost(exc)

    def _stalled(self) -> None:
        if self.conn.their_state is h11.SEND_BODY:
            _time_out_body(self)

    def _expire(self) -> None:
        self._head.handle = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        self.logger.debug("closing a connection that sent no complete request head in time")
        with contextlib.suppress(h11.LocalProtocolError):
            self.conn.send(h11.ConnectionClosed())
        self.transport.close()


if HttpToolsProtocol is not None:

    class HttpToolsHeaderTimeoutProtocol(HttpToolsProtocol):
        """`HttpToolsProtocol` that closes a connection whose request head is not complete
        in time: armed when the connection opens and when a request's first byte is
        parsed, disarmed when its headers are complete."""

        header_timeout: float  # seconds; set by `header_timeout_protocol`
        body_timeout: float = 0.0
        min_body_rate: float = 0.0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._head = _HeadTimer()
            self._body = _BodyTimer()
            super().connection_made(transport)
            self._head.arm(self.loop, self.header_timeout, self._expire)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head.arm(self.loop, self.header_timeout, self._expire)

        def on_headers_complete(self) -> None:
            self._head.disarm()
            super().on_headers_complete()
            # The body's deadline runs from here (a request without one completes at once).
            self._body.arm(self.loop, self.body_timeout, self.min_body_rate, self._stalled)

        def on_body(self, body: bytes) -> None:
            self._body.received += len(body)
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._body.disarm()
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._head.disarm()
            self._body.disarm()
            super().connection_lost(exc)

        def _stalled(self) -> None:
            _time_out_body(self)

        def _expire(self) -> None:
            self._head.handle = None
            if not self.transport.is_closing():
                self.logger.debug("closing a connection that sent no complete request head in time")
                self.transport.close()


def header_timeout_protocol(
    seconds: float, parser: str = "auto", *, body_seconds: float = 0.0, min_body_rate: float = 0.0
) -> type[HeaderTimeoutProtocol] | type[HttpToolsProtocol]:
    """The protocol class to pass uvicorn as `http=`, with a head deadline of `seconds` and
    a body deadline of `body_seconds` at `min_body_rate` bytes a second (0: none).
    `parser`: `httptools`, `h11`, or `auto` (httptools where installed)."""
    base: type = HeaderTimeoutProtocol
    if parser != "h11" and HttpToolsProtocol is not None:
        base = HttpToolsHeaderTimeoutProtocol
    elif parser == "httptools":
        raise RuntimeError("httptools is not installed")
    limits = {
        "header_timeout": seconds,
        "body_timeout": body_seconds,
        "min_body_rate": min_body_rate,
    }
    return type(base.__name__, (base,), limits)
