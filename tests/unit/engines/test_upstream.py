"""The upstream engine on recorded Chat Completions streams in the shapes vLLM and SGLang
document (`reasoning_content` deltas, tool calls split across chunks and interleaved by
index, a final usage chunk with cached tokens) and in the `reasoning` shape other servers
use: each replays through the real app into Responses items and usage. httpx's
MockTransport stands in for the network; the requests respd sends are checked too."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from respd.api.app import create_app
from respd.engines.base import CallDelta, TokenChunk
from respd.engines.upstream import UpstreamEngine, UpstreamSpec, merge_chunks, read_sse
from respd.store import MemoryStore
from tests.support.sdk_types import strict_event, strict_response

MODEL = "served-model"


def sse(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


USAGE = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "model": MODEL,
    "choices": [],
    "usage": {
        "prompt_tokens": 31,
        "completion_tokens": 17,
        "total_tokens": 48,
        "prompt_tokens_details": {"cached_tokens": 16},
    },
}
# vLLM with --reasoning-parser and --tool-call-parser: reasoning first, then two parallel
# calls, each one's argument fragments split across chunks.
VLLM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"reasoning_content": "The user wants "}),
    chunk({"reasoning_content": "two cities."}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "chatcmpl-tool-a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Pa'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ris"}'}}]}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 1,
                    "id": "chatcmpl-tool-b",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": '},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 1, "function": {"arguments": '"Rome"}'}}]}),
    chunk({}, finish="tool_calls"),
    USAGE,
]
# SGLang (and servers that name it `reasoning`): thinking, then a text answer.
SGLANG = [
    chunk({"role": "assistant"}),
    chunk({"reasoning_content": "Short answer."}),
    chunk({"content": "Paris "}),
    chunk({"content": "is the capital."}),
    chunk({}, finish="stop"),
    USAGE,
]
REASONING_FIELD = [
    chunk({"reasoning": "Think."}),
    chunk({"content": "Done."}, finish="stop"),
    USAGE,
]
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture()
def sent() -> list[dict[str, Any]]:
    return []


def app_over(
    reply: Callable[[dict[str, Any]], httpx.Response], sent: list[dict[str, Any]]
) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # the health probe's model list
            return httpx.Response(200, json={"object": "list", "data": [{"id": MODEL}]})
        body = json.loads(request.content)
        sent.append(body)
        return reply(body)

    upstream = httpx.AsyncClient(
        transport=httpx.MockTransport(handler), base_url="http://upstream/v1"
    )
    engine = UpstreamEngine(
        "http://upstream/v1", model_id="front", upstream_model=MODEL, http=upstream
    )
    app = create_app(engine, MemoryStore())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://respd.test")


def streaming(chunks: list[dict[str, Any]]) -> Callable[[dict[str, Any]], httpx.Response]:
    return lambda _: httpx.Response(
        200, content=sse(chunks), headers={"content-type": "text/event-stream"}
    )


async def test_vllm_parallel_calls_and_reasoning(sent: list[dict[str, Any]]) -> None:
    async with app_over(streaming(VLLM), sent) as http:
        r = await http.post(
            "/v1/responses",
            json={
                "model": "front",
                "input": "Weather in Paris and Rome?",
                "tools": [WEATHER, WEATHER | {"name": "get_time"}],
                "tool_choice": "required",
                "reasoning": {"effort": "low"},
            },
        )
    resp = strict_response(r.json())
    assert resp.status == "completed"
    kinds = [o.type for o in resp.output]
    assert kinds == ["reasoning", "function_call", "function_call"], kinds
    calls = [o for o in resp.output if o.type == "function_call"]
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert resp.usage is not None and resp.usage.input_tokens == 31
    assert resp.usage.output_tokens == 17
    assert resp.usage.input_tokens_details.cached_tokens == 16
    [body] = sent
    assert body["model"] == MODEL and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["tool_choice"] == "required" and body["reasoning_effort"] == "low"
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather", "get_time"]


async def test_sglang_text_streams_as_responses_events(sent: list[dict[str, Any]]) -> None:
    async with app_over(streaming(SGLANG), sent) as http:
        r = await http.post(
            "/v1/responses", json={"model": "front", "input": "Capital?", "stream": True}
        )
    events = [
        strict_event(json.loads(line[6:]))
        for line in r.text.splitlines()
        if line.startswith("data: ")
    ]
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert (
        "response.reasoning_text.delta" in types or "response.reasoning_summary_text.delta" in types
    )
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Paris is the capital."


async def test_the_reasoning_field_name_and_a_schema_answer(sent: list[dict[str, Any]]) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    answer = [chunk({"content": '{"a": "x"}'}, finish="stop"), USAGE]
    async with app_over(streaming(REASONING_FIELD), sent) as http:
        r = await http.post("/v1/responses", json={"model": "front", "input": "Go"})
        assert [o["type"] for o in r.json()["output"]] == ["reasoning", "message"]
    async with app_over(streaming(answer), sent) as http:
        fmt = {"type": "json_schema", "name": "a", "schema": schema, "strict": True}
        r = await http.post(
            "/v1/responses", json={"model": "front", "input": "Go", "text": {"format": fmt}}
        )
        assert json.loads(strict_response(r.json()).output_text) == {"a": "x"}
        assert sent[-1]["response_format"]["json_schema"]["schema"] == schema
        c = await http.post(
            "/v1/chat/completions",
            json={
                "model": "front",
                "messages": [{"role": "user", "content": "Go"}],
                "tools": [{"type": "function", "function": WEATHER}],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "parallel_tool_calls": False,
            },
        )
        assert c.status_code == 200
        assert sent[-1]["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
        assert sent[-1]["parallel_tool_calls"] is False


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [
        (httpx.ConnectError("connection refused"), 502, "upstream_error"),
        (httpx.ReadTimeout("timed out"), 504, "upstream_error"),
        (httpx.Response(500, json={"error": {"message": "CUDA out of memory"}}), 502, None),
        (httpx.Response(400, json={"error": {"message": "prompt is too long"}}), 400, None),
        (httpx.Response(429, text="slow down"), 429, None),
    ],
)
async def test_upstream_failures_keep_their_status(
    sent: list[dict[str, Any]], failure: Exception | httpx.Response, status: int, code: str | None
) -> None:
    def reply(_: dict[str, Any]) -> httpx.Response:
        if isinstance(failure, Exception):
            raise failure
        return failure

    refused = status < 500
    async with app_over(reply, sent) as http:
        r = await http.post("/v1/responses", json={"model": "front", "input": "hi"})
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["code"] == ("upstream_refused" if refused else "upstream_error")
        assert error["type"] == ("invalid_request_error" if refused else "server_error")
        if status == 400:
            assert "prompt is too long" in error["message"]  # the upstream's own words
        if status == 429:
            assert "slow down" in error["message"]
        c = await http.post(
            "/v1/chat/completions",
            json={"model": "front", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert c.status_code == status and c.json()["error"]["code"] == error["code"]
        streamed = await http.post(
            "/v1/responses", json={"model": "front", "input": "hi", "stream": True}
        )
        data = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
        last = json.loads(data[-1][6:])
        assert last["type"] == "response.failed"  # a stream has begun: its last event says so
        stored = (await http.get(f"/v1/responses/{last['response']['id']}")).json()
        assert stored["status"] == "failed"


async def test_a_cut_stream_is_an_error_not_a_hang(sent: list[dict[str, Any]]) -> None:
    async def cut() -> AsyncIterator[bytes]:
        yield sse(SGLANG[:3])[: -len(b"data: [DONE]\n\n")]
        raise httpx.ReadError("connection reset")

    def reply(_: dict[str, Any]) -> httpx.Response:
        return httpx.Response(200, content=cut(), headers={"content-type": "text/event-stream"})

    async with app_over(reply, sent) as http:
        r = await http.post("/v1/responses", json={"model": "front", "input": "hi"})
        assert r.status_code == 502
        streamed = await http.post(
            "/v1/responses", json={"model": "front", "input": "hi", "stream": True}
        )
        data = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
        last = json.loads(data[-1][6:])
        assert last["type"] == "response.failed"
        stored = strict_response((await http.get(f"/v1/responses/{last['response']['id']}")).json())
    assert stored.status == "failed"
    assert stored.output_text == "Paris "  # what arrived before the cut is kept


async def test_health_probes_the_upstream() -> None:
    up = {"ok": True}

    def handler(request: httpx.Request) -> httpx.Response:
        if not up["ok"]:
            raise httpx.ConnectError("connection refused")
        return httpx.Response(200, json={"object": "list", "data": [{"id": MODEL}]})

    upstream = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://u/v1")
    engine = UpstreamEngine("http://u/v1", model_id="front", upstream_model=MODEL, http=upstream)
    app = create_app(engine, MemoryStore())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://respd.test") as http:
        assert (await http.get("/health")).status_code == 200
        up["ok"] = False
        down = await http.get("/health")
        assert down.status_code == 503
        assert "ConnectError" in down.json()["engines"]["front"]["problem"]
        up["ok"] = True
        assert (await http.get("/health")).status_code == 200


async def test_benchmark_extensions_are_forwarded(sent: list[dict[str, Any]]) -> None:
    """`ignore_eos` and `min_tokens` reach the upstream under the names vLLM and
    llama-server read, from either API; a request without them sends neither."""
    async with app_over(streaming(SGLANG), sent) as http:
        extra = {"ignore_eos": True, "min_tokens": 12}
        chat = {"model": "front", "messages": [{"role": "user", "content": "hi"}]}
        r = await http.post("/v1/chat/completions", json=chat | extra | {"max_tokens": 12})
        assert r.status_code == 200, r.text
        r = await http.post("/v1/responses", json={"model": "front", "input": "hi"} | extra)
        assert r.status_code == 200, r.text
        r = await http.post("/v1/responses", json={"model": "front", "input": "hi"})
        assert r.status_code == 200, r.text
    first, second, plain = sent
    assert (first["ignore_eos"], first["min_tokens"], first["max_tokens"]) == (True, 12, 12)
    assert (second["ignore_eos"], second["min_tokens"]) == (True, 12)
    assert "ignore_eos" not in plain and "min_tokens" not in plain


async def test_logit_bias_is_forwarded(sent: list[dict[str, Any]]) -> None:
    """Chat's `logit_bias` reaches the upstream as sent (its ids are the upstream's own
    tokenizer's, so it checks them); a request without it sends none."""
    async with app_over(streaming(SGLANG), sent) as http:
        chat = {"model": "front", "messages": [{"role": "user", "content": "hi"}]}
        r = await http.post("/v1/chat/completions", json=chat | {"logit_bias": {"42": -100}})
        assert r.status_code == 200, r.text
        r = await http.post("/v1/chat/completions", json=chat)
        assert r.status_code == 200, r.text
    biased, plain = sent
    assert biased["logit_bias"] == {"42": -100.0}
    assert "logit_bias" not in plain


def test_upstream_entries() -> None:
    spec = UpstreamSpec.parse("big=http://gpu:8000/v1,model=Qwen/Qwen3-8B,key=sk-x,ctx=32768")
    assert spec == UpstreamSpec(
        "http://gpu:8000/v1",
        alias="big",
        model="Qwen/Qwen3-8B",
        api_key="sk-x",
        context_window=32768,
    )
    assert UpstreamSpec.parse("v=https://h/v1,vision=true").vision
    for bad in ("http://h/v1", "a=ftp://h", "a=http://h/v1,colour=red", "a=http://h/v1,ctx=-1"):
        with pytest.raises(ValueError):
            UpstreamSpec.parse(bad)


async def test_what_the_upstream_cannot_enforce_is_refused(sent: list[dict[str, Any]]) -> None:
    upstream = httpx.AsyncClient(
        transport=httpx.MockTransport(lambda _: httpx.Response(500)), base_url="http://u/v1"
    )
    engine = UpstreamEngine(
        "http://u/v1",
        model_id="front",
        upstream_model=MODEL,
        http=upstream,
        forces_tools=False,
        enforces_schemas=False,
    )
    app = create_app(engine, MemoryStore())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://respd.test") as http:
        forced = await http.post(
            "/v1/responses",
            json={"model": "front", "input": "hi", "tools": [WEATHER], "tool_choice": "required"},
        )
        assert forced.status_code == 400 and "cannot force tool calls" in forced.text
        schema = {"type": "object", "properties": {"a": {"type": "string"}}}
        fmt = {"type": "json_schema", "name": "a", "schema": schema}
        answer = await http.post(
            "/v1/responses", json={"model": "front", "input": "hi", "text": {"format": fmt}}
        )
        assert answer.status_code == 400 and "cannot enforce a JSON Schema" in answer.text
        assert answer.json()["error"]["param"] == "text.format"
    spec = UpstreamSpec.parse("a=http://h/v1,tool_choice=false,response_format=no")
    assert not spec.forces_tools and not spec.enforces_schemas


@pytest.mark.parametrize("parallel", [False, True])
async def test_forced_calls_through_an_upstream_that_only_enforces_schemas(
    sent: list[dict[str, Any]], parallel: bool
) -> None:
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    text = json.dumps(call if not parallel else [call, call | {"arguments": {"city": "Rome"}}])
    chunks = [chunk({"content": text[:9]}), chunk({"content": text[9:]}, finish="stop"), USAGE]

    def reply(_: dict[str, Any]) -> httpx.Response:
        return httpx.Response(
            200, content=sse(chunks), headers={"content-type": "text/event-stream"}
        )

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return reply(sent[-1])

    upstream = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://u/v1")
    engine = UpstreamEngine(
        "http://u/v1", model_id="front", upstream_model=MODEL, http=upstream, forces_tools=False
    )
    app = create_app(engine, MemoryStore())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://respd.test") as http:
        r = await http.post(
            "/v1/responses",
            json={
                "model": "front",
                "input": "Weather in Paris?",
                "tools": [WEATHER],
                "tool_choice": "required",
                "parallel_tool_calls": parallel,
            },
        )
    resp = strict_response(r.json())
    calls = [o for o in resp.output if o.type == "function_call"]
    assert resp.status == "completed" and resp.output == calls
    expected = [{"city": "Paris"}, {"city": "Rome"}] if parallel else [{"city": "Paris"}]
    assert [json.loads(c.arguments) for c in calls] == expected
    body = sent[-1]
    assert "tools" not in body and "tool_choice" not in body
    schema = body["response_format"]["json_schema"]["schema"]
    assert (schema.get("type") == "array") == parallel
    assert (
        body["messages"][0]["role"] == "system" and "get_weather" in body["messages"][0]["content"]
    )


def test_chunks_that_arrive_together_merge_in_reading_order() -> None:
    def c(text: str = "", reasoning: str = "", calls: list[CallDelta] | None = None) -> TokenChunk:
        return TokenChunk(text, reasoning=reasoning, calls=calls or [], tokens=1)

    merged = merge_chunks(
        [
            c(reasoning="a"),
            c(reasoning="b"),
            c(text="x"),
            c(text="y"),
            c(reasoning="late"),  # after text: a chunk of its own, so it stays after it
            c(calls=[CallDelta(0, "f", "{")]),
            c(calls=[CallDelta(0, None, "}")]),
            c(text="z"),  # after calls: its own chunk
        ]
    )
    assert [(m.reasoning, m.text, len(m.calls), m.n_tokens) for m in merged] == [
        ("ab", "xy", 0, 4),
        ("late", "", 2, 3),
        ("", "z", 0, 1),
    ]


async def test_sse_reads_become_batches() -> None:
    async def reads() -> AsyncIterator[bytes]:
        body = sse(SGLANG)
        yield body[:25]  # an event split across reads
        yield body[25:]

    batches = [b async for b in read_sse(reads())]
    assert sum(len(b) for b in batches) == len(SGLANG)
    assert len(batches) <= 2
