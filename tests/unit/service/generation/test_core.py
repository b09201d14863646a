"""The generation core through both APIs, on the fake engine: failures end honestly, a
prompt is rendered once, repeated calls end the turn, cut-off calls are incomplete."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import Response

from respd.engines.fake import FakeEngine, Reply
from tests.support.fake import FAKE_MODEL
from tests.support.sdk_types import strict_event, strict_response

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def call_text(city: str) -> str:
    return CALL.replace("Paris", city)


# -- an engine failure mid-stream ---------------------------------------------------------


async def test_responses_stream_engine_raises_ends_with_failed(
    engine: FakeEngine, sdk: openai.AsyncOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    engine.add(Reply(["Hel", "lo", RuntimeError("the GPU caught fire")]))
    stream = await sdk.responses.create(model=FAKE_MODEL, input="hi", stream=True)
    events = [strict_event(e.to_dict()) async for e in stream]
    types = [e.type for e in events]
    assert types[0] == "response.created"
    assert types[-1] == "response.failed"
    assert types.count("response.failed") == 1
    assert "response.output_text.delta" in types  # what came before the failure was sent
    failed = events[-1].response  # type: ignore[union-attr]
    assert failed.status == "failed"
    assert failed.error is not None and failed.error.code == "server_error"
    stored = await sdk.responses.retrieve(failed.id)
    assert stored.status == "failed"


async def test_responses_engine_reports_error_non_streaming(
    engine: FakeEngine, sdk: openai.AsyncOpenAI
) -> None:
    engine.add(Reply(["partial"], finish="error", error="decode failed"))
    resp = strict_response((await sdk.responses.create(model=FAKE_MODEL, input="hi")).to_dict())
    assert resp.status == "failed"
    assert resp.error is not None and "failed" in resp.error.message


async def test_chat_stream_engine_raises_ends_with_error_chunk(
    engine: FakeEngine,
    sdk: openai.AsyncOpenAI,
    http: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine.add(Reply(["Hel", "lo", RuntimeError("boom")]))
    body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        frames = [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    last = json.loads(frames[-2])
    assert set(last) == {"error"}
    assert set(last["error"]) == {"message", "type", "param", "code"}
    assert last["error"]["type"] == "server_error"
    for frame in frames[:-2]:
        ChatCompletionChunk.model_validate_json(frame)
    # The SDK turns the error event into an exception, after the text that came first.
    engine.add(Reply(["Hel", RuntimeError("boom")]))
    stream = await sdk.chat.completions.create(
        model=FAKE_MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    seen = ""
    with pytest.raises(openai.APIError, match="failed"):
        async for chunk in stream:
            if chunk.choices:
                seen += chunk.choices[0].delta.content or ""
    assert seen == "Hel"


async def test_chat_non_streaming_engine_failure_is_500_json(
    engine: FakeEngine, sdk: openai.AsyncOpenAI
) -> None:
    engine.add(Reply(["x", RuntimeError("boom")]))
    with pytest.raises(openai.InternalServerError) as info:
        await sdk.chat.completions.create(
            model=FAKE_MODEL, messages=[{"role": "user", "content": "hi"}]
        )
    assert info.value.status_code == 500
    body = info.value.response.json()
    assert body["error"]["type"] == "server_error"


async def test_engine_busy_is_503_before_any_event(sdk: openai.AsyncOpenAI) -> None:
    busy = FakeEngine(model_id=FAKE_MODEL, capacity=0)
    from respd.api.app import create_app

    app = create_app(busy)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.post("/v1/responses", json={"model": FAKE_MODEL, "input": "hi", "stream": True})
    assert r.status_code == 503
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "server_is_overloaded"


# -- one render per request ---------------------------------------------------------------


async def test_one_render_per_request(engine: FakeEngine, sdk: openai.AsyncOpenAI) -> None:
    engine.add("ok", "ok", "ok")
    await sdk.responses.create(model=FAKE_MODEL, input="hi", instructions="Be brief.")
    assert engine.renders == 1
    await sdk.chat.completions.create(model=FAKE_MODEL, messages=[{"role": "user", "content": "x"}])
    assert engine.renders == 2
    await sdk.responses.create(
        model=FAKE_MODEL, input="hi", tools=[WEATHER], reasoning={"effort": "low"}
    )
    assert engine.renders == 3


async def test_truncation_renders_logarithmically(sdk: openai.AsyncOpenAI) -> None:
    engine = FakeEngine(model_id=FAKE_MODEL, context_window=2000)
    from respd.api.app import create_app

    app = create_app(engine)
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i:04d}"}
        for i in range(1001)
    ]
    engine.add("ok")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.post(
            "/v1/responses",
            json={
                "model": FAKE_MODEL,
                "input": turns,
                "instructions": "keep me",
                "truncation": "auto",
                "max_output_tokens": 16,
            },
        )
    assert r.status_code == 200, r.text
    assert engine.renders <= 2 + 11  # the whole, all dropped, then a binary search
    kept = engine.calls[0].prompt.messages
    assert kept[0].role == "system" and kept[0].text == "keep me"
    assert kept[-1].text == "turn 1000"
    # The fewest turns were dropped: one more would still fit? No: the next-older turn
    # back would overflow, so the prompt is nearly full.
    assert engine.calls[0].prompt.n_tokens + 16 <= 2000
    assert engine.calls[0].prompt.n_tokens + 16 > 2000 - 40


# -- calls: repeats end the turn, cut-off calls are incomplete ---------------------------


async def test_repeated_identical_call_ends_the_turn(
    engine: FakeEngine, sdk: openai.AsyncOpenAI
) -> None:
    engine.add(
        Reply(
            [
                call_text("Paris"),
                "\n",
                call_text("Rome"),
                "\n",
                call_text("Paris"),
                "\n",
                call_text("Oslo"),
            ]
        )
    )
    resp = strict_response(
        (
            await sdk.responses.create(
                model=FAKE_MODEL, input="weather?", tools=[WEATHER], tool_choice="required"
            )
        ).to_dict()
    )
    assert resp.status == "completed"
    calls = [json.loads(o.arguments)["city"] for o in resp.output if o.type == "function_call"]
    assert calls == ["Paris", "Rome"]
    assert engine.calls[0].cancelled  # the rest of the generation was stopped


async def test_repeated_call_on_chat_gives_tool_calls(
    engine: FakeEngine, sdk: openai.AsyncOpenAI
) -> None:
    engine.add(Reply([call_text("Paris"), "\n", call_text("Paris")]))
    chat = await sdk.chat.completions.create(
        model=FAKE_MODEL,
        messages=[{"role": "user", "content": "weather?"}],
        tools=[{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}],
        tool_choice="required",
    )
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls or []) == 1


async def test_same_function_other_arguments_streams_on(
    engine: FakeEngine, sdk: openai.AsyncOpenAI
) -> None:
    pieces = [call_text("Paris"), "\n", *call_text("Parma")]
    engine.add(Reply(pieces))
    stream = await sdk.responses.create(
        model=FAKE_MODEL, input="w", tools=[WEATHER], tool_choice="required", stream=True
    )
    events = [strict_event(e.to_dict()) async for e in stream]
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [json.loads(e.item.arguments)["city"] for e in done] == ["Paris", "Parma"]  # type: ignore[union-attr]


async def test_call_cut_off_by_budget_is_incomplete(
    engine: FakeEngine, sdk: openai.AsyncOpenAI
) -> None:
    engine.add(Reply(list(call_text("Paris"))))  # one token per character
    resp = strict_response(
        (
            await sdk.responses.create(
                model=FAKE_MODEL,
                input="weather?",
                tools=[WEATHER],
                tool_choice="required",
                max_output_tokens=40,
            )
        ).to_dict()
    )
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    calls = [o for o in resp.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].status == "incomplete"


# -- defects the black-box run found ---------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"model": FAKE_MODEL, "input": [{"type": {}}]}),
        ("/v1/responses", {"model": FAKE_MODEL, "input": [{"type": ["message"]}]}),
        ("/v1/responses/input_tokens", {"model": FAKE_MODEL, "input": [{"type": {}}]}),
        ("/v1/conversations", {"items": [{"type": {}}]}),
    ],
)
async def test_non_string_item_type_is_400(http: httpx.AsyncClient, path: str, body: dict) -> None:
    r = await http.post(path, json=body)
    assert r.status_code == 400, r.text
    param = "items[0].type" if path.endswith("conversations") else "input[0].type"
    assert r.json()["error"]["param"] == param


async def test_non_string_item_type_in_conversation_items_route(http: httpx.AsyncClient) -> None:
    conv = (await http.post("/v1/conversations", json={})).json()
    r = await http.post(f"/v1/conversations/{conv['id']}/items", json={"items": [{"type": 1}]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "items[0].type"


async def test_input_tokens_keeps_the_json_schema(sdk: openai.AsyncOpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    count = await sdk.responses.input_tokens.count(
        model=FAKE_MODEL,
        input="hi",
        text={"format": {"type": "json_schema", "name": "x", "schema": schema, "strict": True}},
    )
    assert count.input_tokens > 0


async def test_input_tokens_ignores_fields_it_does_not_take(http: httpx.AsyncClient) -> None:
    """Fields of create's body that a count does not take (even malformed) are ignored, as
    unknown fields are, never a 500."""
    body = {"model": FAKE_MODEL, "input": "hi", "max_output_tokens": ["x"], "stream": "yes"}
    r = await http.post("/v1/responses/input_tokens", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["input_tokens"] > 0


async def test_function_tools_echo_strict(engine: FakeEngine, sdk: openai.AsyncOpenAI) -> None:
    engine.add("sunny")
    stream = await sdk.responses.create(model=FAKE_MODEL, input="w", tools=[WEATHER], stream=True)
    events = [strict_event(e.to_dict()) async for e in stream]
    lifecycle = [e for e in events if hasattr(e, "response")]
    assert lifecycle
    for event in lifecycle:
        tools = event.response.tools  # type: ignore[union-attr]
        assert tools[0].strict is True  # type: ignore[union-attr]
    raw = events[-1].response.model_dump()  # type: ignore[union-attr]
    assert raw["tools"][0]["strict"] is True
    explicit = dict(WEATHER, strict=False)
    engine.add("sunny")
    resp = await sdk.responses.create(model=FAKE_MODEL, input="w", tools=[explicit])
    assert resp.tools[0].strict is False  # type: ignore[union-attr]


async def test_timestamps_are_integers(engine: FakeEngine, http: httpx.AsyncClient) -> None:
    engine.add("hi")
    resp = (await http.post("/v1/responses", json={"model": FAKE_MODEL, "input": "x"})).json()
    assert type(resp["created_at"]) is int and type(resp["completed_at"]) is int
    again = (await http.get(f"/v1/responses/{resp['id']}")).json()
    assert type(again["created_at"]) is int and type(again["completed_at"]) is int
    conv = (await http.post("/v1/conversations", json={})).json()
    assert type(conv["created_at"]) is int
    up = await http.post(
        "/v1/files",
        files={"file": ("a.txt", b"hello", "text/plain")},
        data={"purpose": "user_data"},
    )
    assert type(up.json()["created_at"]) is int


async def test_non_object_tool_parameters_are_400(http: httpx.AsyncClient) -> None:
    tool = {"type": "function", "name": "f", "parameters": {"type": "array"}}
    r = await http.post(
        "/v1/responses",
        json={"model": FAKE_MODEL, "input": "x", "tools": [tool], "tool_choice": "required"},
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "tools[0].parameters"


async def test_responses_parse_through_the_core(
    engine: FakeEngine, sdk: openai.AsyncOpenAI
) -> None:
    """The SDK's `parse()` helper gets the constraint the engine is asked to enforce."""
    from pydantic import BaseModel

    class Answer(BaseModel):
        city: str

    engine.add('{"city": "Paris"}')
    resp = await sdk.responses.parse(model=FAKE_MODEL, input="where?", text_format=Answer)
    assert resp.output_parsed == Answer(city="Paris")
    constraint = engine.calls[0].prompt.compiled
    assert constraint.answer["properties"]["city"]["type"] == "string"
    assert isinstance(resp, Response)
