"""Function tools on `/v1/responses` against a real server and the real `openai` SDK.

The default server uses SmolLM2's plain ChatML template, so tools go through the generic
system-prompt format; `family_server` serves the same weights with Qwen-, Llama-3- and
Mistral-style templates. Forced calls are grammar-enforced, so they must be well-formed and
schema-valid on every seed.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseFunctionToolCall

from tests.support.schemas import WEATHER_PARAMS
from tests.support.sdk_types import strict_event, strict_response
from tests.support.servers import MODEL_ID, RespdServer

pytestmark = pytest.mark.long  # twenty seeds and three template families

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": WEATHER_PARAMS,
    "strict": True,
}
TIME = {
    "type": "function",
    "name": "get_time",
    "description": "Current time in a time zone.",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
        "required": ["zone"],
        "additionalProperties": False,
    },
    "strict": True,
}
STOCK = {
    "type": "function",
    "name": "get_stock",
    "description": "Stock price of a ticker.",
    "parameters": {
        "type": "object",
        "properties": {"ticker": {"type": "string", "maxLength": 6}, "days": {"type": "integer"}},
        "required": ["ticker", "days"],
        "additionalProperties": False,
    },
    "strict": True,
}
TOOLS = [WEATHER, TIME, STOCK]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}
PROMPT = "What is the weather in Paris right now?"


def calls_of(r: Response) -> list[ResponseFunctionToolCall]:
    return [o for o in r.output if o.type == "function_call"]


def assert_valid_call(call: ResponseFunctionToolCall, allowed: set[str]) -> dict[str, Any]:
    assert call.name in allowed
    assert call.id and call.id.startswith("fc_")
    assert call.call_id.startswith("call_")
    assert call.status == "completed"
    args = json.loads(call.arguments)
    jsonschema.validate(args, SCHEMAS[call.name])
    return dict(args)


def create(client: openai.OpenAI, **kw: Any) -> Response:
    kw.setdefault("max_output_tokens", 80)
    r = client.responses.with_raw_response.create(model=MODEL_ID, **kw)
    return strict_response(json.loads(r.text))


def forced_call(client: openai.OpenAI, choice: Any, seed: int) -> Response:
    """One sampled (temperature 1) answer to PROMPT under a forcing `tool_choice`."""
    return create(
        client,
        input=PROMPT,
        tools=TOOLS,
        tool_choice=choice,
        parallel_tool_calls=False,
        temperature=1.0,
        extra_body={"seed": seed},
    )


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_stock"}])
def test_forced_calls_are_schema_valid_on_20_seeds(
    client: openai.OpenAI, choice: str | dict[str, str]
) -> None:
    allowed = {"get_stock"} if isinstance(choice, dict) else set(SCHEMAS)
    for seed in range(20):
        r = forced_call(client, choice, seed)
        assert r.status == "completed", (seed, r.output)
        calls = calls_of(r)
        assert len(calls) == 1, (seed, r.output)
        assert_valid_call(calls[0], allowed)
        assert r.output == calls, "a forced call answers with the call only"
        assert r.tool_choice == (choice if isinstance(choice, str) else r.tool_choice)


def test_template_families_force_valid_calls(family_server: RespdServer) -> None:
    client = family_server.client()
    for seed in range(20):
        choice: Any = "required" if seed % 2 else {"type": "function", "name": "get_weather"}
        r = forced_call(client, choice, seed)
        calls = calls_of(r)
        assert r.status == "completed" and len(calls) == 1, (family_server.args, seed, r.output)
        assert_valid_call(calls[0], set(SCHEMAS) if seed % 2 else {"get_weather"})


def test_template_family_round_trip(family_server: RespdServer) -> None:
    client = family_server.client()
    first = create(
        client, input=PROMPT, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False
    )
    call = calls_of(first)[0]
    second = create(
        client,
        input=[
            {"role": "user", "content": PROMPT},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": "Sunny, 21 degrees.",
            },
        ],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=20,
    )
    assert not calls_of(second)
    assert [o.type for o in second.output] == ["message"]
    # the call and its output reached the prompt through the template's tool support
    bare = create(client, input=PROMPT, tools=[WEATHER], tool_choice="none", max_output_tokens=1)
    assert second.usage and bare.usage
    assert second.usage.input_tokens > bare.usage.input_tokens + 10


def test_streamed_arguments_arrive_while_generated(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {
        "model": MODEL_ID,
        "input": PROMPT,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "name": "get_weather"},
        "parallel_tool_calls": False,
        "max_output_tokens": 80,
        "stream": True,
    }
    with client.responses.with_streaming_response.create(**kw) as raw:
        events = [
            strict_event(json.loads(line[6:]))
            for line in raw.iter_lines()
            if line.startswith("data: ")
        ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    added = events[2]
    assert added.type == "response.output_item.added"
    assert added.item.type == "function_call" and added.item.name == "get_weather"
    assert added.item.arguments == "" and added.item.status == "in_progress"
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 3, "arguments must stream as they are generated"
    assert all(d.item_id == added.item.id and d.output_index == 0 for d in deltas)
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert "".join(d.delta for d in deltas) == done.arguments  # type: ignore[union-attr]
    item_done = next(e for e in events if e.type == "response.output_item.done")
    assert item_done.item.id == added.item.id  # type: ignore[union-attr]
    assert item_done.item.arguments == done.arguments  # type: ignore[union-attr]
    assert types[-1] == "response.completed"
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output[0].arguments == done.arguments
    assert_valid_call(final.output[0], {"get_weather"})
    assert "response.content_part.added" not in types


def test_sdk_stream_helper_accumulates_function_calls(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL_ID,
        input=PROMPT,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=80,
    ) as stream:
        snapshots = [
            e.snapshot for e in stream if e.type == "response.function_call_arguments.delta"
        ]
        final = stream.get_final_response()
    call = final.output[0]
    assert isinstance(call, ResponseFunctionToolCall)
    assert snapshots and snapshots[-1] == call.arguments
    assert_valid_call(call, {"get_weather"})


def test_allowed_tools_restricts_the_choice(client: openai.OpenAI) -> None:
    choice = {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "function", "name": "get_time"}],
    }
    for seed in range(6):
        r = create(
            client,
            input=PROMPT,
            tools=TOOLS,
            tool_choice=choice,
            parallel_tool_calls=False,
            extra_body={"seed": seed},
        )
        calls = calls_of(r)
        assert len(calls) == 1
        assert_valid_call(calls[0], {"get_time"})


def test_tool_choice_none_never_calls(client: openai.OpenAI) -> None:
    for seed in range(6):
        r = create(
            client,
            input="Call get_weather for Paris. Reply only with the <tool_call> block.",
            tools=TOOLS,
            tool_choice="none",
            max_output_tokens=40,
            extra_body={"seed": seed},
        )
        assert not calls_of(r)
        assert all(o.type == "message" for o in r.output)


def test_parallel_calls_and_max_tool_calls(client: openai.OpenAI) -> None:
    counts = []
    for seed in range(4):
        r = create(
            client,
            input="Weather in Paris, Rome and Oslo?",
            tools=TOOLS,
            tool_choice="required",
            max_tool_calls=2,
            max_output_tokens=120,
            extra_body={"seed": seed},
        )
        calls = calls_of(r)
        assert 1 <= len(calls) <= 2
        for c in calls:
            assert_valid_call(c, set(SCHEMAS))
        assert len({c.call_id for c in calls}) == len(calls)
        assert [o.type for o in r.output] == ["function_call"] * len(calls)
        counts.append(len(calls))
    assert 2 in counts, "several calls per turn when parallel calls are allowed"


# The weather tool of the Open Responses compliance suite: a free-text location, no bounds.
COMPLIANCE_WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a location",
    "parameters": {
        "type": "object",
        "properties": {
            "location": {"type": "string", "description": "The city and state, e.g. Paris"}
        },
        "required": ["location"],
    },
}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_required_call_without_a_budget_ends_promptly_without_repeats(
    client: openai.OpenAI, seed: int
) -> None:
    """Forced calls with no `max_output_tokens`: the model repeating its call ends the turn
    (the repeat is not emitted), so the response ends well before the context does, and
    every call it holds has whole JSON arguments."""
    started = time.monotonic()
    r = client.responses.with_raw_response.create(
        model=MODEL_ID,
        input="What's the weather like in San Francisco?",
        tools=[COMPLIANCE_WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        extra_body={"seed": seed},
    )
    elapsed = time.monotonic() - started
    resp = strict_response(json.loads(r.text))
    calls = calls_of(resp)
    assert resp.status == "completed" and calls
    keys = [(c.name, json.loads(c.arguments)) for c in calls]
    assert all(k == "get_weather" and isinstance(a.get("location"), str) for k, a in keys)
    assert len({json.dumps(a, sort_keys=True) for _, a in keys}) == len(keys), keys
    assert resp.usage is not None and resp.usage.output_tokens < 400
    assert elapsed < 60


def test_a_call_cut_off_by_the_budget_is_incomplete(client: openai.OpenAI) -> None:
    """A budget that ends inside the arguments makes the call item and the response
    `incomplete`; the cut-off arguments are never passed off as a completed call."""
    r = client.responses.with_raw_response.create(
        model=MODEL_ID,
        input="What's the weather like in San Francisco?",
        tools=[COMPLIANCE_WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,  # greedy: the budget ends inside the location string
        max_output_tokens=24,
    )
    resp = strict_response(json.loads(r.text))
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    calls = calls_of(resp)
    assert calls and calls[-1].status == "incomplete"
    assert all(c.status == "completed" for c in calls[:-1])
    with pytest.raises(json.JSONDecodeError):
        json.loads(calls[-1].arguments)


def test_round_trip_call_then_output_then_answer(client: openai.OpenAI) -> None:
    first = create(
        client, input=PROMPT, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False
    )
    call = calls_of(first)[0]
    items: list[Any] = [
        {"role": "user", "content": PROMPT},
        call.model_dump(exclude_none=True),
        {
            "type": "function_call_output",
            "call_id": call.call_id,
            "output": "It is sunny and 21 degrees celsius.",
        },
    ]
    second = create(
        client,
        input=items,
        tools=[WEATHER],
        tool_choice="auto",
        max_output_tokens=30,
        temperature=0,
    )
    assert second.status in ("completed", "incomplete")
    assert second.output_text or calls_of(second)
    third = create(
        client,
        input=items,
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=30,
        temperature=0,
    )
    assert not calls_of(third) and third.output_text.strip()


def _error(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 400, r.text
    err: dict[str, Any] = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    return err


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        ({"tool_choice": {"type": "function", "name": "get_weather"}}, "tool_choice.name"),
        (
            {
                "tools": TOOLS,
                "tool_choice": {
                    "type": "allowed_tools",
                    "mode": "required",
                    "tools": [{"type": "function", "name": "nope"}],
                },
            },
            "tool_choice.tools[0].name",
        ),
        ({"tools": [], "tool_choice": "required"}, "tool_choice"),
        (
            {
                "tools": TOOLS,
                "tool_choice": "required",
                "text": {
                    "format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}
                },
            },
            "tool_choice",
        ),
        ({"tools": [WEATHER, {"type": "teleport"}]}, "tools[1].type"),
        ({"tools": [{**WEATHER, "name": "bad name!"}]}, "tools[0].name"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].name"),
        (
            {
                "tools": [
                    {
                        **WEATHER,
                        "parameters": {
                            "type": "object",
                            "properties": {"n": {"type": "number", "multipleOf": 0.5}},
                        },
                    }
                ]
            },
            "tools[0].parameters",
        ),
        ({"tools": TOOLS, "tool_choice": {"type": "web_search"}}, "tool_choice.type"),
        ({"tools": [WEATHER, {"type": "image_generation"}]}, "tools[1].type"),
        ({"tools": TOOLS, "max_tool_calls": 0}, "max_tool_calls"),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "hi"}]},
            "input[0].call_id",
        ),
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
        ),
    ],
)
def test_tool_requests_that_are_400(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    body.setdefault("input", "hi")
    err = _error(http.post("/v1/responses", json={"model": MODEL_ID, **body}))
    assert err["param"] == param, err
    if "type" in param and "tools[" in param:
        kind = body["tools"][int(param[6])]["type"]
        assert kind in err["message"]


def test_web_search_without_a_backend_is_left_out_and_the_turn_goes_on(
    client: openai.OpenAI,
) -> None:
    """With no --web-search-backend, a web_search tool is not shown to the model and the
    response is an ordinary one (Codex offers web_search on every turn)."""
    hosted = [{"type": "web_search"}]
    with_hosted = client.responses.input_tokens.count(
        model=MODEL_ID,
        input="Hi",
        tools=[WEATHER, *hosted],  # type: ignore[list-item]
    )
    alone = client.responses.input_tokens.count(model=MODEL_ID, input="Hi", tools=[WEATHER])  # type: ignore[list-item]
    assert with_hosted.input_tokens == alone.input_tokens
    r = client.responses.create(
        model=MODEL_ID,
        input="Hi",
        tools=[WEATHER, *hosted],
        max_output_tokens=8,  # type: ignore[list-item]
    )
    assert r.status in ("completed", "incomplete")
    assert [t.type for t in r.tools] == ["function", "web_search"]
