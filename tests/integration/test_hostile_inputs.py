"""Hostile inputs that once cost gigabytes or minutes become quick, clean 4xx answers, and
the server keeps serving: unbounded grammar repetitions, deep schemas, huge truncations,
bodies nested too deep, lone surrogates, non-finite numbers, non-object tool parameters."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.servers import MODEL_ID, RespdServer, start_server

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
            "text": {"format": {"type": "json_schema", "name": "a", "schema": _deep(30)}},
        },
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "text.format"


@pytest.fixture(scope="module")
def small_window(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    """A 512-token window: what the truncation keeps costs little to decode, so the time
    a request takes is mostly the truncation's own."""
    srv = start_server(tmp_path_factory.mktemp("small-window"), "--ctx-size", "512")
    yield srv
    srv.stop()
    srv.assert_no_5xx()


@pytest.mark.parametrize("turns", [250, 2000])
def test_truncation_of_long_histories_is_quick(small_window: RespdServer, turns: int) -> None:
    items = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Message number {i}. " * 8}
        for i in range(turns)
    ]
    items.append({"role": "user", "content": "Say OK."})
    t0 = time.monotonic()
    r = httpx.post(
        small_window.base_url + "/v1/responses",
        json={
            "model": MODEL_ID,
            "input": items,
            "truncation": "auto",
            "max_output_tokens": 4,
            "store": False,
        },
        timeout=120,
    )
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] + 4 <= 512
    assert took < 30, f"{turns} turns took {took:.1f}s"


# -- hostile JSON bodies ----------------------------------------------------------------------

CHAT_BODY: dict[str, Any] = {"model": MODEL_ID, "messages": [{"role": "user", "content": "x"}]}
ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/responses", {"model": MODEL_ID, "input": "x"}),
    ("/v1/responses/input_tokens", {"model": MODEL_ID, "input": "x"}),
    ("/v1/chat/completions", CHAT_BODY),
    ("/v1/conversations", {}),
]


def _with(body: dict[str, Any], key: str, raw: str) -> bytes:
    """`body` as JSON with `key` set to the verbatim JSON text `raw`."""
    text = json.dumps({**body, key: None})
    return text.replace(f'"{key}": null', f'"{key}": {raw}').encode()


def _post(http: httpx.Client, path: str, raw: bytes) -> httpx.Response:
    return http.post(path, content=raw, headers={"content-type": "application/json"})


def _error(r: httpx.Response, code: str, param: str | None = None) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param)


def _stored() -> list[int]:
    """Responses, conversations and conversation items in the shared server's SQLite store
    (it keeps its data in RESPD_DATA_DIR)."""
    path = Path(os.environ["RESPD_DATA_DIR"]) / "respd.sqlite3"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return [
            db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("responses", "conversations", "conversation_items")
        ]


@pytest.mark.parametrize(("path", "body"), ROUTES)
def test_deep_json_is_400_on_every_route(
    http: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    for levels in (1000, 100_000):
        t0 = time.monotonic()
        r = _post(http, path, _with(body, "metadata", "[" * levels + "]" * levels))
        assert time.monotonic() - t0 < 5
        _error(r, "invalid_json")
    assert http.get("/health").status_code == 200


def test_a_schema_nested_1000_deep_is_400(http: httpx.Client) -> None:
    schema = '{"type": "string"}'
    for _ in range(1000):
        schema = f'{{"type": "object", "properties": {{"x": {schema}}}}}'
    fmt = f'{{"format": {{"type": "json_schema", "name": "a", "schema": {schema}}}}}'
    r = _post(http, "/v1/responses", _with({"model": MODEL_ID, "input": "x"}, "text", fmt))
    _error(r, "invalid_json")


def test_lone_surrogates_are_400_and_store_nothing(http: httpx.Client) -> None:
    before = _stored()
    items = '[{"type": "message", "role": "user", "content": "a \\ud800 b"}]'
    _error(
        _post(http, "/v1/conversations", _with({}, "items", items)),
        "invalid_value",
        "items[0].content",
    )
    for stream in (False, True):
        body = {"model": MODEL_ID, "input": "x", "stream": stream, "max_output_tokens": 4}
        r = _post(http, "/v1/responses", _with(body, "metadata", '{"k": "\\ud800"}'))
        _error(r, "invalid_value", "metadata.k")
        r = _post(http, "/v1/responses", _with({**body, "input": None}, "input", items))
        _error(r, "invalid_value", "input[0].content")
    chat = {**CHAT_BODY, "store": True, "max_tokens": 4}
    r = _post(http, "/v1/chat/completions", _with(chat, "metadata", '{"k": "\\udfff"}'))
    _error(r, "invalid_value", "metadata.k")
    conv = http.post("/v1/conversations", json={}).json()
    r = _post(http, f"/v1/conversations/{conv['id']}/items", _with({}, "items", items))
    _error(r, "invalid_value", "items[0].content")
    assert http.get(f"/v1/conversations/{conv['id']}/items").json()["data"] == []
    after = _stored()
    assert after[0] == before[0] and after[2] == before[2]
    assert after[1] == before[1] + 1  # only the good conversation
    ok = http.post("/v1/responses", json={"model": MODEL_ID, "input": "Hi", "max_output_tokens": 4})
    assert ok.status_code == 200


@pytest.mark.parametrize(
    ("bias", "code", "param"),
    [
        ('{"50256": NaN}', "invalid_json", None),
        ('{"50256": -Infinity}', "invalid_json", None),
        ('{"50256": 1e999}', "invalid_value", "logit_bias.50256"),
        ('{"50256": 101}', "invalid_value", "logit_bias.50256"),
    ],
)
def test_bad_logit_bias_is_400(http: httpx.Client, bias: str, code: str, param: str | None) -> None:
    _error(_post(http, "/v1/chat/completions", _with(CHAT_BODY, "logit_bias", bias)), code, param)
    assert http.get("/health").status_code == 200


def test_non_object_tool_parameters_are_400(http: httpx.Client) -> None:
    schema = {"type": "array", "items": {"type": "string"}}
    cases = [
        (
            "/v1/responses",
            {
                "model": MODEL_ID,
                "input": "x",
                "tools": [{"type": "function", "name": "f", "parameters": schema}],
                "tool_choice": "required",
            },
            "tools[0].parameters",
        ),
        (
            "/v1/chat/completions",
            {
                **CHAT_BODY,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            "tools[0].function.parameters",
        ),
    ]
    for path, body, param in cases:
        r = http.post(path, json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
