"""uvicorn with the header-timeout protocols (httptools, h11): connections that never
finish a request head are closed after the deadline, while complete requests, before and
after, are served."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from respd.header_timeout import header_timeout_protocol
from tests.support.uvicorn_server import Ports, serving_each

pytestmark = pytest.mark.waits  # deadlines and delays, run first (see conftest)

TIMEOUT = 0.5


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture()
async def ports() -> AsyncIterator[Ports]:
    protocols = {name: header_timeout_protocol(TIMEOUT, name) for name in ("httptools", "h11")}
    async with serving_each(_app, protocols, timeout_keep_alive=30) as ports:
        yield ports


async def _closed(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before closing (b"" if nothing)."""
    return await reader.read()


async def test_stalled_connections_are_closed(ports: Ports) -> None:
    async def case(port: int) -> None:
        # Before the first connection: no deadline can have started earlier (the other
        # protocol's case runs in the same loop, and may take turns in between).
        t0 = time.monotonic()
        conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
        for i, (_, writer) in enumerate(conns):
            if i % 2:  # half send part of a request line, half nothing at all
                writer.write(b"GET /hea")
                await writer.drain()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/")).status_code == 200  # served meanwhile
        await asyncio.wait_for(
            asyncio.gather(*(_closed(reader) for reader, _ in conns)), timeout=TIMEOUT + 3
        )
        assert time.monotonic() - t0 >= TIMEOUT * 0.8
        for _, writer in conns:
            writer.close()

    await ports.each(case)


async def test_dribbled_headers_do_not_extend_the_deadline(ports: Ports) -> None:
    async def case(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)

        async def dribble() -> None:
            with contextlib.suppress(ConnectionError):
                writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # a head that never ends
                while not writer.is_closing():
                    writer.write(b"a")
                    await writer.drain()
                    await asyncio.sleep(TIMEOUT / 5)

        t0 = time.monotonic()
        task = asyncio.create_task(dribble())
        assert await asyncio.wait_for(reader.read(), timeout=TIMEOUT + 3) == b""
        assert time.monotonic() - t0 < TIMEOUT + 1
        writer.close()
        await task

    await ports.each(case)


async def test_kept_alive_connection_stalling_mid_head_is_closed(ports: Ports) -> None:
    async def case(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        await reader.readuntil(b"0\r\n\r\n")  # the chunked body's end
        await asyncio.sleep(TIMEOUT * 2)  # idle between requests: kept alive (keep-alive 30s)
        t0 = time.monotonic()  # before the bytes go: the deadline cannot start earlier
        writer.write(b"GET / HTTP/1.1\r\nHo")  # the next head starts and stalls
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), timeout=TIMEOUT + 3) == b""
        assert time.monotonic() - t0 >= TIMEOUT * 0.8
        writer.close()

    await ports.each(case)


async def test_slow_but_complete_heads_are_served(ports: Ports) -> None:
    async def case(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for piece in (b"GET / HTTP/1.1\r\n", b"Host: x\r\n", b"\r\n"):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(TIMEOUT / 4)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
        assert head.startswith(b"HTTP/1.1 200")
        writer.close()

    await ports.each(case)
