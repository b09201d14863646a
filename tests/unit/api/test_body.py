"""Hostile JSON bodies are 400s before any model, engine or store sees them: nesting past
`MAX_JSON_DEPTH`, lone UTF-16 surrogates in any string, numbers that are not finite, and
`logit_bias` outside [-100, 100]; nothing is stored."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from respd.api.body import MAX_JSON_DEPTH, check_json, load_json
from respd.engines.fake import FakeEngine
from respd.protocol.errors import InvalidRequest
from tests.support.fake import FAKE_MODEL

CHAT_MESSAGES = [{"role": "user", "content": "hi"}]
ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/responses", {"model": FAKE_MODEL, "input": "hi"}),
    ("/v1/responses/input_tokens", {"model": FAKE_MODEL, "input": "hi"}),
    ("/v1/chat/completions", {"model": FAKE_MODEL, "messages": CHAT_MESSAGES}),
    ("/v1/conversations", {}),
]


def nested(levels: int) -> str:
    """A JSON array nested `levels` deep."""
    return "[" * levels + "]" * levels


def with_field(body: dict[str, Any], key: str, raw_value: str) -> str:
    """`body` as JSON text with `key` set to `raw_value`, verbatim JSON."""
    return (
        json.dumps({**body, key: None})[:-1].replace(f'"{key}": null', f'"{key}": {raw_value}')
        + "}"
    )


async def post_raw(http: httpx.AsyncClient, path: str, text: str) -> httpx.Response:
    return await http.post(path, content=text, headers={"content-type": "application/json"})


def assert_error(r: httpx.Response, code: str, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == 400, r.text
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code
    assert error["param"] == param
    return error


# -- the walk itself --------------------------------------------------------------------------


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, 1000, 100_000])
def test_deep_nesting_is_invalid_json_quickly(levels: int) -> None:
    t0 = time.monotonic()
    with pytest.raises(InvalidRequest) as info:
        load_json(('{"a":' + nested(levels - 1) + "}").encode())
    assert info.value.code == "invalid_json"
    assert str(MAX_JSON_DEPTH) in info.value.message
    assert time.monotonic() - t0 < 1


def test_nesting_at_the_bound_passes() -> None:
    data = load_json(('{"a":' + nested(MAX_JSON_DEPTH - 1) + "}").encode())
    assert isinstance(data["a"], list)


def test_the_walk_does_not_recurse() -> None:
    """Deeper than Python's recursion limit: still a clean refusal, not a RecursionError."""
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(InvalidRequest, match="nested deeper"):
        check_json({"a": deep})


@pytest.mark.parametrize(
    ("text", "param"),
    [
        ('{"metadata": {"k": "\\ud800"}}', "metadata.k"),
        ('{"input": [{"content": [{"text": "ok \\udfff"}]}]}', "input[0].content[0].text"),
        ('{"input": ["x", "\\ud83d"]}', "input[1]"),
        ('{"metadata": {"\\ud800": "v"}}', "metadata"),  # a bad key: its object is named
        ('"\\ud800"', None),
    ],
)
def test_lone_surrogates_are_refused_by_path(text: str, param: str | None) -> None:
    with pytest.raises(InvalidRequest) as info:
        load_json(text.encode())
    assert info.value.code == "invalid_value"
    assert info.value.param == param
    info.value.message.encode("utf-8")  # the error itself can be sent


def test_surrogate_pairs_and_non_ascii_text_pass() -> None:
    data = load_json('{"a": "\\ud83d\\ude00 café 日本", "b": ["ü"]}'.encode())
    assert data["a"] == "\U0001f600 café 日本"


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_literals_are_invalid_json(literal: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        load_json(f'{{"temperature": {literal}}}'.encode())
    assert info.value.code == "invalid_json"
    assert literal in info.value.message


def test_numbers_that_overflow_to_infinity_are_refused() -> None:
    with pytest.raises(InvalidRequest) as info:
        load_json(b'{"logit_bias": {"50256": 1e400}}')
    assert info.value.code == "invalid_value"
    assert info.value.param == "logit_bias.50256"


def test_an_integer_too_long_to_convert_is_invalid_json() -> None:
    with pytest.raises(InvalidRequest) as info:
        load_json(b'{"seed": ' + b"1" * 5000 + b"}")
    assert info.value.code == "invalid_json"


def test_a_huge_key_is_not_echoed_as_the_param() -> None:
    key = "k" * 10_000
    with pytest.raises(InvalidRequest) as info:
        load_json(json.dumps({"metadata": {key: "\ud800"}}).encode())
    assert info.value.param == "metadata"


# -- over HTTP, on every JSON route -----------------------------------------------------------


@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_deep_bodies_are_400_on_every_route(
    http: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> None:
    r = await post_raw(http, path, with_field(body, "metadata", nested(1000)))
    assert_error(r, "invalid_json")
    r = await post_raw(http, path, with_field(body, "metadata", nested(MAX_JSON_DEPTH)))
    assert_error(r, "invalid_json")  # the body's own level makes one too many


@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_lone_surrogates_are_400_on_every_route(
    http: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> None:
    r = await post_raw(http, path, with_field(body, "metadata", '{"k": "\\ud800"}'))
    assert_error(r, "invalid_value", "metadata.k")


@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_nan_is_400_on_every_route(
    http: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> None:
    r = await post_raw(http, path, with_field(body, "temperature", "NaN"))
    assert_error(r, "invalid_json")


async def test_a_deep_answer_schema_is_400(engine: FakeEngine, http: httpx.AsyncClient) -> None:
    schema = '{"type": "string"}'
    for _ in range(1000):
        schema = f'{{"type": "object", "properties": {{"x": {schema}}}}}'
    fmt = f'{{"format": {{"type": "json_schema", "name": "a", "schema": {schema}}}}}'
    body = {"model": FAKE_MODEL, "input": "hi"}
    r = await post_raw(http, "/v1/responses", with_field(body, "text", fmt))
    assert_error(r, "invalid_json")
    assert not engine.calls


async def test_surrogates_in_items_store_nothing(
    engine: FakeEngine, http: httpx.AsyncClient
) -> None:
    items = '[{"type": "message", "role": "user", "content": "a \\ud800 b"}]'
    r = await post_raw(http, "/v1/conversations", with_field({}, "items", items))
    assert_error(r, "invalid_value", "items[0].content")
    body = {"model": FAKE_MODEL, "stream": True}
    r = await post_raw(http, "/v1/responses", with_field(body, "input", items))
    assert_error(r, "invalid_value", "input[0].content")
    assert not engine.calls
    engine.add("ok")  # the app still answers
    ok = await http.post("/v1/responses", json={"model": FAKE_MODEL, "input": "hi"})
    assert ok.status_code == 200


@pytest.mark.parametrize(
    ("bias", "code", "param"),
    [
        ('{"50256": NaN}', "invalid_json", None),
        ('{"50256": Infinity}', "invalid_json", None),
        ('{"50256": 1e999}', "invalid_value", "logit_bias.50256"),
        ('{"50256": 100.5}', "invalid_value", "logit_bias.50256"),
        ('{"50256": -101}', "invalid_value", "logit_bias.50256"),
        ('{"hello": 5}', "invalid_value", "logit_bias.hello"),
    ],
)
async def test_bad_logit_bias_is_400(
    engine: FakeEngine, http: httpx.AsyncClient, bias: str, code: str, param: str | None
) -> None:
    body = {"model": FAKE_MODEL, "messages": CHAT_MESSAGES}
    r = await post_raw(http, "/v1/chat/completions", with_field(body, "logit_bias", bias))
    assert_error(r, code, param)
    assert not engine.calls


async def test_logit_bias_in_range_is_accepted(engine: FakeEngine, http: httpx.AsyncClient) -> None:
    engine.add("ok")
    body = {"model": FAKE_MODEL, "messages": CHAT_MESSAGES, "logit_bias": {"1": -100, "2": 100}}
    r = await http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
