"""uvicorn's HTTP/1.1 protocols with a deadline for the request head.

uvicorn bounds an idle keep-alive connection but not one that is opened and never sends
a complete request line and headers: each such connection would hold a socket and a
file descriptor for as long as the client likes. Here a connection must deliver a whole
request head within `header_timeout` seconds of opening, or of the first byte of its next
request on a kept-alive connection, or it is closed.

Both of uvicorn's parsers get the deadline: httptools (C, llhttp), used where installed
because it writes a streamed body with far less Python per frame, and h11 otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

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


class HeaderTimeoutProtocol(H11Protocol):
    """`H11Protocol` that closes a connection whose request head is not complete in time;
    subclass it with `header_timeout_protocol` to set the deadline."""

    header_timeout: float  # seconds; set by `header_timeout_protocol`

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head = _HeadTimer()
        super().connection_made(transport)
        self._head.arm(self.loop, self.header_timeout, self._expire)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            # The head of a kept-alive connection's next request begins.
            self._head.arm(self.loop, self.header_timeout, self._expire)
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._head.disarm()  # a whole head arrived: the request has begun

    def connection_lost(self, exc: Exception | None) -> None:
        self._head.disarm()
        super().connection_lost(exc)

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

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._head = _HeadTimer()
            super().connection_made(transport)
            self._head.arm(self.loop, self.header_timeout, self._expire)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head.arm(self.loop, self.header_timeout, self._expire)

        def on_headers_complete(self) -> None:
            self._head.disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._head.disarm()
            super().connection_lost(exc)

        def _expire(self) -> None:
            self._head.handle = None
            if not self.transport.is_closing():
                self.logger.debug("closing a connection that sent no complete request head in time")
                self.transport.close()


def header_timeout_protocol(
    seconds: float, parser: str = "auto"
) -> type[HeaderTimeoutProtocol] | type[HttpToolsProtocol]:
    """The protocol class to pass uvicorn as `http=`, with a deadline of `seconds` (0: none).
    `parser`: `httptools`, `h11`, or `auto` (httptools where installed)."""
    base: type = HeaderTimeoutProtocol
    if parser != "h11" and HttpToolsProtocol is not None:
        base = HttpToolsHeaderTimeoutProtocol
    elif parser == "httptools":
        raise RuntimeError("httptools is not installed")
    return type(base.__name__, (base,), {"header_timeout": seconds})
