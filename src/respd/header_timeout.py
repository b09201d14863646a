"""uvicorn's HTTP/1.1 protocol with a deadline for the request head.

uvicorn bounds an idle keep-alive connection but not one that is opened and never sends
a complete request line and headers: each such connection would hold a socket and a
file descriptor for as long as the client likes. Here a connection must deliver a whole
request head within `header_timeout` seconds of opening, or of the first byte of its next
request on a kept-alive connection, or it is closed.
"""

from __future__ import annotations

import asyncio
import contextlib

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class HeaderTimeoutProtocol(H11Protocol):
    """`H11Protocol` that closes a connection whose request head is not complete in time;
    subclass it with `header_timeout_protocol` to set the deadline."""

    header_timeout: float = 10.0
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._arm()  # the head of a kept-alive connection's next request begins
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # a whole head arrived: the request has begun

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._head_timer is None and self.header_timeout > 0:
            self._head_timer = self.loop.call_later(self.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _expire(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        self.logger.debug("closing a connection that sent no complete request head in time")
        with contextlib.suppress(h11.LocalProtocolError):
            self.conn.send(h11.ConnectionClosed())
        self.transport.close()


def header_timeout_protocol(seconds: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class to pass uvicorn as `http=`, with a deadline of `seconds` (0: none)."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout": seconds})
