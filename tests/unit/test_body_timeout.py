"""uvicorn with the body deadline (httptools, h11): a body that trickles in is answered 408
and closed at the deadline; a body that keeps coming at the minimum rate outlasts it; a
body that arrives in time, and a WebSocket held open past the deadline, are unaffected."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from starlette.types import Receive, Scope, Send

from respd.header_timeout import header_timeout_protocol
from tests.support.uvicorn_server import Ports, serving_each

pytestmark = pytest.mark.waits  # deadlines and delays, run first (see conftest)

TIMEOUT = 0.6
RATE = 2000  # bytes a second


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the whole body, answers its length."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


@pytest.fixture()
async def ports() -> AsyncIterator[Ports]:
    protocols = {
        name: header_timeout_protocol(5.0, name, body_seconds=TIMEOUT, min_body_rate=RATE)
        for name in ("httptools", "h11")
    }
    async with serving_each(_app, protocols) as ports:
        yield ports


def _head(length: int) -> bytes:
    return (
        f"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n"
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()


async def _send_slowly(
    writer: asyncio.StreamWriter, chunk: bytes, every: float, times: int
) -> None:
    with contextlib.suppress(ConnectionError):
        for _ in range(times):
            if writer.is_closing():
                return
            writer.write(chunk)
            await writer.drain()
            await asyncio.sleep(every)


async def _answer(reader: asyncio.StreamReader) -> bytes | None:
    """What the server sent before closing, or None where the close arrived as a reset: a
    server that closes a socket holding unread bytes (the trickle's last ones) sends RST,
    which may overtake the 408 it wrote just before."""
    try:
        return await reader.read()
    except ConnectionResetError:
        return None


async def test_a_trickled_body_is_answered_408_and_closed(ports: Ports) -> None:
    async def case(port: int) -> None:
        conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(8)]
        t0 = time.monotonic()
        trickles = []
        for _, writer in conns:
            writer.write(_head(1_000_000))
            trickles.append(asyncio.create_task(_send_slowly(writer, b"x", TIMEOUT / 4, 100)))
        answers = await asyncio.wait_for(
            asyncio.gather(*(_answer(reader) for reader, _ in conns)), timeout=TIMEOUT * 3 + 2
        )
        waited = time.monotonic() - t0
        assert TIMEOUT * 0.8 <= waited < TIMEOUT * 3 + 1
        assert any(answer is not None for answer in answers)  # not every close was a reset
        for answer in answers:
            if answer is not None:
                assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
                assert b'"code":"request_timeout"' in answer
        for task in trickles:
            task.cancel()
        for _, writer in conns:
            writer.close()

    await ports.each(case)


async def test_a_body_at_the_minimum_rate_outlasts_the_deadline(ports: Ports) -> None:
    async def case(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # Three deadlines' worth at 4x the minimum rate: a loaded machine's late sleeps
        # still leave it well above the rate.
        chunk = b"y" * (RATE * 2 // 5)
        times = int(TIMEOUT * 3 / 0.1)
        writer.write(_head(len(chunk) * times))
        await _send_slowly(writer, chunk, 0.1, times)
        # The whole chunked answer, not the close: the connection is kept alive.
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n0\r\n\r\n"), timeout=5)
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert b"\r\n%d\r\n" % (len(chunk) * times) in answer  # the whole body was read
        writer.close()

    await ports.each(case)


async def test_kept_alive_requests_each_get_their_own_deadline(ports: Ports) -> None:
    async def case(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(3):
            writer.write(_head(5) + b"hello")
            await writer.drain()
            answer = await asyncio.wait_for(reader.readuntil(b"\r\n0\r\n\r\n"), timeout=2)
            assert answer.startswith(b"HTTP/1.1 200 ") and b"\r\n5\r\n" in answer
            await asyncio.sleep(TIMEOUT * 0.7)  # idle between requests: no body is owed
        writer.close()

    await ports.each(case)
