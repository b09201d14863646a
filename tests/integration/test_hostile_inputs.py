"""Hostile inputs that once cost gigabytes or minutes become quick, clean 4xx answers, and
the server keeps serving: unbounded grammar repetitions, deep schemas, huge truncations."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.servers import MODEL_ID, RespdServer

BOMBS = [
    {"type": "string", "minLength": 1_000_000_000},
    {"type": "string", "maxLength": 1_000_000_000},
    {"type": "array", "items": {"type": "string"}, "minItems": 1_000_000_000},
    {"type": "string", "pattern": "^a{1000000000}$"},
]


def _rss_mb(server: RespdServer) -> float:
    status = open(f"/proc/{server.process.pid}/status").read()  # noqa: SIM115
    line = next(x for x in status.splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def _deep(n: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(n):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


@pytest.mark.parametrize("schema", BOMBS)
def test_grammar_bombs_are_400_at_once(
    http: httpx.Client, server: RespdServer, schema: dict[str, Any]
) -> None:
    rss = _rss_mb(server)
    answer = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    tool = {"type": "function", "name": "f", "parameters": answer}
    chat_tool = {"type": "function", "function": {"name": "f", "parameters": answer}}
    requests = [
        (
            "/v1/responses",
            {
                "model": MODEL_ID,
                "input": "x",
                "text": {"format": {"type": "json_schema", "name": "a", "schema": answer}},
            },
            "text.format",
        ),
        (
            "/v1/responses",
            {"model": MODEL_ID, "input": "x", "tools": [tool], "tool_choice": "required"},
            "tools[0].parameters",
        ),
        (
            "/v1/chat/completions",
            {
                "model": MODEL_ID,
                "messages": [{"role": "user", "content": "x"}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": answer},
                },
            },
            "response_format.json_schema",
        ),
        (
            "/v1/chat/completions",
            {
                "model": MODEL_ID,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [chat_tool],
                "tool_choice": "required",
            },
            "tools[0].function.parameters",
        ),
    ]
    for path, body, param in requests:
        t0 = time.monotonic()
        r = http.post(path, json=body)
        assert time.monotonic() - t0 < 5
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param
        assert "4096" in error["message"]  # names the largest bound it can enforce
    assert _rss_mb(server) - rss < 100
    assert http.get("/health").status_code == 200


def test_a_deep_schema_is_400(http: httpx.Client) -> None:
    r = http.post(
        "/v1/responses",
        json={
            "model": MODEL_ID,
            "input": "x",
            "text": {"format": {"type": "json_schema", "name": "a", "schema": _deep(200)}},
        },
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "text.format"


@pytest.mark.parametrize("turns", [250, 2000])
def test_truncation_of_long_histories_is_quick(http: httpx.Client, turns: int) -> None:
    items = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Message number {i}. " * 8}
        for i in range(turns)
    ]
    items.append({"role": "user", "content": "Say OK."})
    t0 = time.monotonic()
    r = http.post(
        "/v1/responses",
        json={
            "model": MODEL_ID,
            "input": items,
            "truncation": "auto",
            "max_output_tokens": 4,
            "store": False,
        },
    )
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] + 4 <= 2048
    assert took < 30, f"{turns} turns took {took:.1f}s"
