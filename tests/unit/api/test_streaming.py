"""SSE framing: template frames equal a full dump of the same event, and the event-stream
response writes frames, keep-alive comments and its end in order."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.responses import (
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
)
from starlette.types import Message

from respd.api.responses import EventFrames
from respd.api.streaming import KEEPALIVE, DeltaFrames, EventStreamResponse, sse_frame
from respd.protocol.wire import wire


def _chunk(content: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }


@given(text=st.text())
def test_a_template_frame_is_the_full_dump(text: str) -> None:
    frames = DeltaFrames(_chunk(DeltaFrames.TEXT))
    assert frames.frame(text) == sse_frame(_chunk(text))


@given(text=st.text(), seq=st.integers(min_value=0, max_value=10**9))
def test_template_frames_carry_the_sequence_number(text: str, seq: int) -> None:
    def event(delta: str, number: int) -> dict[str, Any]:
        return {"type": "t.delta", "sequence_number": number, "item_id": "i", "delta": delta}

    frames = DeltaFrames(event(DeltaFrames.TEXT, DeltaFrames.NUMBER), "t.delta")
    assert frames.frame(text, seq) == sse_frame(event(text, seq), "t.delta")


def test_a_sample_without_the_marker_is_refused() -> None:
    with pytest.raises(ValueError):
        DeltaFrames({"delta": "x"})


@given(
    deltas=st.lists(st.tuples(st.sampled_from(["msg_a", "msg_b"]), st.text()), max_size=20),
    start=st.integers(min_value=0, max_value=1000),
)
def test_event_frames_equal_whole_dumps(deltas: list[tuple[str, str]], start: int) -> None:
    encoder = EventFrames()
    for n, (item, text) in enumerate(deltas):
        events: list[ResponseStreamEvent] = [
            ResponseTextDeltaEvent.model_construct(
                type="response.output_text.delta",
                item_id=item,
                output_index=0 if item == "msg_a" else 1,
                content_index=0,
                delta=text,
                logprobs=[],
                sequence_number=start + n,
            ),
            ResponseFunctionCallArgumentsDeltaEvent(
                type="response.function_call_arguments.delta",
                item_id="fc_" + item,
                output_index=2,
                delta=text,
                sequence_number=start + n,
            ),
        ]
        for event in events:
            data = wire(event)
            assert encoder.frame(event) == sse_frame(data, data["type"])
            body = encoder.frame(event).decode().split("data: ", 1)[1]
            assert type(event).model_validate(json.loads(body)) == event


async def _run(
    response: EventStreamResponse, *, disconnect_after: float | None = None
) -> list[Message]:
    sent: list[Message] = []
    gone = asyncio.Event()

    async def receive() -> Message:
        if disconnect_after is None:
            await gone.wait()
        else:
            await asyncio.sleep(disconnect_after)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)
    return sent


async def test_frames_keepalives_and_end_in_order() -> None:
    closed: list[str] = []

    async def frames() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        await asyncio.sleep(0.35)  # quiet: keep-alive comments go out meanwhile
        yield b"data: 2\n\n"

    sent = await _run(
        EventStreamResponse(frames(), keepalive=0.1, on_close=lambda: closed.append("x"))
    )
    assert sent[0]["type"] == "http.response.start"
    bodies = [m["body"] for m in sent[1:]]
    assert bodies[0] == b"data: 1\n\n"
    assert bodies[-2:] == [b"data: 2\n\n", b""]
    assert sent[-1]["more_body"] is False
    assert 2 <= bodies.count(KEEPALIVE) <= 4
    assert set(bodies[1:-2]) == {KEEPALIVE}
    assert closed == ["x"]


async def test_a_disconnect_closes_the_source_while_it_waits() -> None:
    closed: list[str] = []

    async def frames() -> AsyncIterator[bytes]:
        try:
            yield b"data: 1\n\n"
            await asyncio.sleep(30)  # e.g. queued behind busy slots
            yield b"data: 2\n\n"
        finally:
            closed.append("source")

    sent = await _run(
        EventStreamResponse(frames(), on_close=lambda: closed.append("slot")), disconnect_after=0.05
    )
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n"]
    assert closed == ["source", "slot"]
