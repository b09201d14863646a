"""Tools and response_format on `/v1/chat/completions`, through the real SDK."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.support.schemas import WEATHER_PARAMS
from tests.support.servers import MODEL_ID

PARAMS = WEATHER_PARAMS
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": PARAMS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    },
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_forced_tool_call(client: openai.OpenAI) -> None:
    for seed in range(5):
        r = client.chat.completions.create(
            model=MODEL_ID,
            messages=ASK,
            tools=TOOLS,
            max_tokens=80,
            seed=seed,  # type: ignore[arg-type]
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=False,
        )
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls or []
        assert len(calls) == 1 and calls[0].function.name == "get_weather"  # type: ignore[union-attr]
        assert calls[0].id.startswith("call_")
        jsonschema.validate(json.loads(calls[0].function.arguments), PARAMS)  # type: ignore[union-attr]


def test_streamed_tool_call_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL_ID,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",  # type: ignore[arg-type]
        parallel_tool_calls=False,
        max_tokens=80,
        stream=True,
    )
    pieces: list[str] = []
    heads = []
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for tc in delta.tool_calls or []:
            assert tc.index == 0
            if tc.id:
                heads.append((tc.id, tc.function.name))  # type: ignore[union-attr]
            pieces.append(tc.function.arguments or "")  # type: ignore[union-attr]
        finish = chunk.choices[0].finish_reason or finish
    assert len(heads) == 1 and heads[0][1] in ("get_weather", "get_time")
    assert finish == "tool_calls"
    assert sum(1 for p in pieces if p) > 1, "arguments stream while generated"
    json.loads("".join(pieces))


def test_round_trip_with_tool_message(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model=MODEL_ID,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",  # type: ignore[arg-type]
        parallel_tool_calls=False,
        max_tokens=80,
    )
    call = (first.choices[0].message.tool_calls or [])[0]
    messages: list[Any] = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees."},
    ]
    second = client.chat.completions.create(
        model=MODEL_ID, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=30
    )
    assert second.choices[0].message.content
    assert not second.choices[0].message.tool_calls


def test_response_format_json_schema_and_object(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "population": {"type": "integer"},
        },
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "A big city as JSON."}],
        max_tokens=60,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "city", "schema": schema, "strict": True},
        },
    )
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), schema)
    r = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "A city as JSON."}],
        max_tokens=100,
        response_format={"type": "json_object"},
    )
    text = r.choices[0].message.content or ""
    assert text.lstrip().startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice.function.name",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        (
            {
                "tools": TOOLS,
                "tool_choice": "required",
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {}},
                },
            },
            "tool_choice",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"messages": [{"role": "tool", "tool_call_id": "call_x", "content": "hi"}]},
            "messages[0].tool_call_id",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"type": "function", "function": {"name": "f", "arguments": "{}"}}
                        ],
                    }
                ]
            },
            "messages[0].tool_calls[0].id",
        ),
    ],
)
def test_chat_tool_400s(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    body.setdefault("messages", ASK)
    r = http.post("/v1/chat/completions", json={"model": MODEL_ID, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
