"""Steering over HTTP (`POST /v1/responses/{id}/steer`), on the app and the fake engine
behind a real uvicorn on 127.0.0.1: a steer reaches a response streaming for the same key
and never another key's; input that waits for a client's tool output goes ahead of the next
create that continues it. Every event is checked against the SDK's types."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from openai.types.responses import ResponsesServerEvent
from pydantic import TypeAdapter

from respd.api.app import create_app
from respd.api.identity import KeyRing
from respd.engines.fake import FakeEngine, Reply
from respd.store import MemoryStore
from tests.support.fake import FAKE_MODEL
from tests.support.sdk_types import strict_response
from tests.support.uvicorn_server import serving

pytestmark = pytest.mark.waits  # deadlines and delays, run first (see conftest)

EVENTS: TypeAdapter[ResponsesServerEvent] = TypeAdapter(ResponsesServerEvent)
A = {"authorization": "Bearer sk-a"}
B = {"authorization": "Bearer sk-b"}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]


async def _events(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    async for line in lines:
        if line.startswith("data: "):
            event: dict[str, Any] = json.loads(line[6:])
            EVENTS.validate_python(event)
            yield event


async def test_a_steer_reaches_its_keys_stream_only() -> None:
    words = Reply([f"word{i} " for i in range(60)], delay=0.01)
    engine = FakeEngine([words, "Short."], model_id=FAKE_MODEL)
    app = create_app(engine, MemoryStore(), keys=KeyRing(["sk-a", "sk-b"]))
    async with (
        serving(app) as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http,
    ):
        body = {"model": FAKE_MODEL, "input": "Talk.", "stream": True}
        async with http.stream("POST", "/v1/responses", json=body, headers=A) as r:
            events = _events(r.aiter_lines())
            created = await anext(events)
            target = created["response"]["id"]
            other = await http.post(f"/v1/responses/{target}/steer", json={"input": "x"}, headers=B)
            assert other.status_code == 404  # another key's response is not there to steer
            assert other.json()["error"]["code"] == "response_not_found"
            bad = await http.post(f"/v1/responses/{target}/steer", json={"input": []}, headers=A)
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
            ok = await http.post(
                f"/v1/responses/{target}/steer", json={"input": "Be brief."}, headers=A
            )
            assert ok.status_code == 200, ok.text
            rest = [event async for event in events]
    types = [e["type"] for e in rest]
    assert types.count("response.steer.accepted") == 1 and types.count("response.created") == 1
    # Steered before its message began it ends `steered`; steered inside its one message it
    # finishes that message first, and ends on its own: either way the successor follows.
    first_end = rest[types.index("response.created") - 1]
    assert first_end["response"]["id"] == target
    assert first_end["response"]["status"] in ("incomplete", "completed")
    if first_end["response"]["status"] == "incomplete":
        assert first_end["response"]["incomplete_details"] == {"reason": "steered"}
    successor = strict_response(rest[-1]["response"])
    assert successor.previous_response_id == target and successor.output_text == "Short."
    assert engine.calls[-1].prompt.request.messages[-1].text == "Be brief."


async def test_input_waiting_for_tool_output_goes_ahead_of_the_next_create() -> None:
    engine = FakeEngine([Reply(list(CALL), delay=0.005), "It is sunny."], model_id=FAKE_MODEL)
    app = create_app(engine, MemoryStore(), keys=KeyRing(["sk-a", "sk-b"]))
    async with (
        serving(app) as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http,
    ):
        body = {"model": FAKE_MODEL, "input": "Weather?", "tools": TOOLS, "stream": True}
        async with http.stream("POST", "/v1/responses", json=body, headers=A) as r:
            events = _events(r.aiter_lines())
            target = (await anext(events))["response"]["id"]
            async for event in events:  # until the call has begun
                if event["type"] == "response.output_item.added":
                    break
            steer = {"input": "Answer in French."}
            ok = await http.post(f"/v1/responses/{target}/steer", json=steer, headers=A)
            assert ok.status_code == 200, ok.text
            rest = [event async for event in events]
        done = strict_response(
            next(e for e in rest if e["type"] == "response.completed")["response"]
        )
        (call,) = [o for o in done.output if o.type == "function_call"]
        assert rest[-1]["type"] == "response.steer.pending"  # after the response's end
        assert rest[-1]["required_input"][0]["call_id"] == call.call_id
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        follow = {
            "model": FAKE_MODEL,
            "previous_response_id": target,
            "input": [output],
            "tools": TOOLS,
        }
        final = await http.post("/v1/responses", json=follow, headers=A)
        assert final.status_code == 200, final.text
        assert strict_response(final.json()).output_text == "It is sunny."
    messages = engine.calls[-1].prompt.request.messages
    assert [m.role for m in messages][-2:] == ["user", "tool"]
    assert messages[-2].text == "Answer in French."
