"""The upstream engine against a real HTTP server on 127.0.0.1 (a few lines of asyncio that
speak just enough HTTP/1.1): what it sends (an image between two texts stays between them,
as an `image_url` content part), and that `cancel` closes the request at once, whether the
stream waits for the response, for its next bytes, or for nothing."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from PIL import Image as PILImage

from respd.api.app import create_app
from respd.engines.base import (
    Admitted,
    ChatMessage,
    GenerationDone,
    GenerationEvent,
    Image,
    PromptRequest,
    SamplingParams,
    TokenChunk,
)
from respd.engines.upstream import UpstreamEngine
from respd.store import MemoryStore

DISCONNECT_WITHIN = 1.0  # seconds from `cancel()` to the upstream seeing the hang-up


def sse_event(text: str) -> bytes:
    delta = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return f"data: {json.dumps(delta)}\n\n".encode()


@dataclass
class Upstream:
    """A Chat Completions server that records each request's body. `header_delay` holds the
    response back; after the first event, `event_delay` passes between events."""

    header_delay: float = 0.0
    event_delay: float = 0.0
    events: int = 3
    bodies: list[dict[str, Any]] = field(default_factory=list)
    received: asyncio.Event = field(default_factory=asyncio.Event)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.decode().split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        self.bodies.append(json.loads(await reader.readexactly(length)))
        self.received.set()
        # The client sends nothing more: end of file means it hung up.
        hangup = asyncio.create_task(reader.read(1))
        try:
            await self._answer(writer, hangup)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            if hangup.done():
                self.disconnected.set()
            hangup.cancel()
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, hangup: asyncio.Task[bytes]) -> None:
        async def pause(seconds: float) -> bool:
            """Wait, or stop early when the client hangs up; True when it did."""
            done, _ = await asyncio.wait({hangup}, timeout=seconds)
            return bool(done)

        if await pause(self.header_delay):
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
        )
        for i in range(self.events):
            if i and await pause(self.event_delay):
                return
            writer.write(sse_event(f"word{i} "))
            await writer.drain()
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()
        await pause(5)  # until the client closes its side


@pytest.fixture()
async def serve() -> AsyncIterator[Any]:
    servers: list[asyncio.Server] = []

    async def start(upstream: Upstream) -> Upstream:
        server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
        servers.append(server)
        upstream.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        return upstream

    yield start
    for server in servers:
        server.close()


def engine_for(upstream: Upstream, **kw: Any) -> UpstreamEngine:
    return UpstreamEngine(upstream.url, model_id="remote", timeout=30, **kw)


async def started(engine: UpstreamEngine) -> Any:
    prompt = await engine.prepare(PromptRequest([ChatMessage("user", "Count.")]))
    stream = engine.generate(prompt, SamplingParams())
    assert isinstance(await anext(stream), Admitted)
    return stream


async def cancelled_in_time(
    upstream: Upstream, engine: UpstreamEngine, stream: Any, pending: asyncio.Task[Any] | None
) -> None:
    """`cancel()` ends the stream with a `cancelled` done, and the upstream sees its
    client hang up within `DISCONNECT_WITHIN`."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    stream.cancel()
    last: GenerationEvent = await asyncio.wait_for(
        pending if pending is not None else anext(stream), DISCONNECT_WITHIN
    )
    assert isinstance(last, GenerationDone) and last.finish_reason == "cancelled"
    await asyncio.wait_for(upstream.disconnected.wait(), DISCONNECT_WITHIN)
    assert loop.time() - start < DISCONNECT_WITHIN
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
    stats = engine.stats()
    assert (stats.cancelled, stats.running, stats.completed) == (1, 0, 0)
    await engine.http.aclose()


async def test_cancel_while_waiting_for_the_next_bytes(serve: Any) -> None:
    upstream = await serve(Upstream(event_delay=30))
    engine = engine_for(upstream)
    stream = await started(engine)
    first = await anext(stream)
    assert isinstance(first, TokenChunk) and first.text == "word0 "
    pending = asyncio.create_task(anext(stream))
    await asyncio.sleep(0.1)  # the reader now waits on the network
    await cancelled_in_time(upstream, engine, stream, pending)


async def test_cancel_while_waiting_for_the_response(serve: Any) -> None:
    upstream = await serve(Upstream(header_delay=30))
    engine = engine_for(upstream)
    stream = await started(engine)
    pending = asyncio.create_task(anext(stream))
    await asyncio.wait_for(upstream.received.wait(), 5)
    await cancelled_in_time(upstream, engine, stream, pending)


async def test_cancel_between_reads(serve: Any) -> None:
    upstream = await serve(Upstream(event_delay=30))
    engine = engine_for(upstream)
    stream = await started(engine)
    assert isinstance(await anext(stream), TokenChunk)
    await cancelled_in_time(upstream, engine, stream, None)


async def test_a_cancelled_reader_is_not_taken_for_a_cancel(serve: Any) -> None:
    """The reader's own task being cancelled propagates; closing the stream hangs up."""
    upstream = await serve(Upstream(event_delay=30))
    engine = engine_for(upstream)
    stream = await started(engine)
    assert isinstance(await anext(stream), TokenChunk)
    pending = asyncio.create_task(anext(stream))
    await asyncio.sleep(0.1)
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    await stream.aclose()
    await asyncio.wait_for(upstream.disconnected.wait(), DISCONNECT_WITHIN)
    assert engine.stats().cancelled == 1 and engine.stats().running == 0
    await engine.http.aclose()


def png() -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (8, 8), "red").save(buf, format="PNG")
    return buf.getvalue()


async def test_an_image_between_two_texts_arrives_between_them(serve: Any) -> None:
    upstream = await serve(Upstream())
    engine = engine_for(upstream, vision=True)
    image = png()
    uri = "data:image/png;base64," + base64.b64encode(image).decode()
    app = create_app(engine, MemoryStore())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://respd.test"
    ) as http:
        r = await http.post(
            "/v1/responses",
            json={
                "model": "remote",
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "Compare"},
                            {"type": "input_image", "image_url": uri, "detail": "low"},
                            {"type": "input_text", "text": "with the first."},
                        ],
                    }
                ],
            },
        )
    assert r.status_code == 200, r.text
    assert r.json()["output"][0]["content"][0]["text"] == "word0 word1 word2 "
    [body] = upstream.bodies
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Compare"},
                {"type": "image_url", "image_url": {"url": uri, "detail": "low"}},
                {"type": "text", "text": "with the first."},
            ],
        }
    ]
    assert "__media__" not in json.dumps(body)
    await engine.http.aclose()


async def test_an_assistant_image_moves_to_a_user_turn_after_it(serve: Any) -> None:
    """Chat Completions takes images on user turns only."""
    upstream = await serve(Upstream())
    engine = engine_for(upstream, vision=True)
    red = Image(png(), "image/png")
    turns = [
        ChatMessage("user", "Draw."),
        ChatMessage("assistant", ["Here:", red, "done"]),
        ChatMessage("user", "Again."),
    ]
    prompt = await engine.prepare(PromptRequest(turns))
    events = [e async for e in engine.generate(prompt, SamplingParams())]
    assert isinstance(events[-1], GenerationDone) and events[-1].finish_reason == "stop"
    messages = upstream.bodies[0]["messages"]
    assert [(m["role"], m["content"] if m["role"] != "user" else None) for m in messages] == [
        ("user", None),
        ("assistant", "Here:\ndone"),
        ("user", None),
        ("user", None),
    ]
    assert [p["type"] for p in messages[2]["content"]] == ["image_url"]
    await engine.http.aclose()
