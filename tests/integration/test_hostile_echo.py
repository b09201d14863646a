"""The echoed-field and tool/schema fuzz against a real `respd serve` with the embedded
model, through the `openai` SDK (HTTP and its WebSocket connection): no 5xx, every 200 a
valid Response or completion, every stream ended by a terminal event (Chat: `[DONE]`),
every WebSocket create answered through to a terminal or `error` event on a socket that
stays open. Smaller than the unit fuzz: each example runs the real model (a few tokens).
The reproductions of the defects it guards against are pinned first."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion

from tests.support.hostile import (
    CHAT_FIELDS,
    RESPONSES_FIELDS,
    TERMINAL,
    bodies,
    check_stream_end,
)
from tests.support.sdk_types import strict_response
from tests.support.servers import MODEL_ID, RespdServer, start_server

FUZZ = settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    database=None,
)
RESPONSES_BASE = {"model": MODEL_ID, "input": "Say hi."}
CHAT_BASE = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Say hi."}]}
ECHOED = ["reasoning", "text", "tools", "tool_choice", "prompt_cache_retention", "include"]
OUTCOMES: Counter[str] = Counter()
JSON_FORMAT = {"type": "json_schema", "name": "x"}
FUNCTION = {"type": "function", "name": "f"}
BAD = {"properties": "abc"}


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    srv = start_server(
        tmp_path_factory.mktemp("hostile-echo"),
        "--ctx-size", "1024",
        "--threads", "2",
        "--max-output-tokens", "6",
    )  # fmt: skip
    yield srv
    srv.stop()
    print(f"\nhostile echo fuzz: {dict(sorted(OUTCOMES.items()))}")
    srv.assert_no_5xx()


@pytest.fixture(scope="module")
def sdk(fuzzed: RespdServer) -> openai.OpenAI:
    return fuzzed.client(timeout=120)


@pytest.fixture(scope="module")
def raw(fuzzed: RespdServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzzed.base_url, timeout=120) as c:
        yield c


def _refused(exc: openai.APIStatusError) -> None:
    assert exc.status_code < 500, exc
    assert isinstance(exc.body, dict) and {"message", "type", "param", "code"} <= set(exc.body)
    OUTCOMES[str(exc.status_code)] += 1


def _fields(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("model", "input")}


def _create(sdk: openai.OpenAI, body: dict[str, Any]) -> None:
    try:
        response = sdk.responses.create(model=MODEL_ID, input=body["input"], **_fields(body))
    except openai.APIStatusError as exc:
        _refused(exc)
        return
    strict_response(response.model_dump(mode="json", exclude_unset=True))
    OUTCOMES["200"] += 1


def _stream(sdk: openai.OpenAI, body: dict[str, Any]) -> None:
    try:
        stream = sdk.responses.create(
            model=MODEL_ID, input=body["input"], stream=True, **_fields(body)
        )
        last = None
        with stream:
            for event in stream:
                last = event.type
    except openai.APIStatusError as exc:
        _refused(exc)
        return
    assert last in TERMINAL, f"a stream ended after {last!r}"
    OUTCOMES["stream"] += 1


# -- the reproductions ----------------------------------------------------------------------


def test_reproductions(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.responses.create(
            model=MODEL_ID,
            input="hi",
            reasoning={"effort": "extreme"},  # type: ignore[typeddict-item]
        )
    assert exc.value.param == "reasoning.effort"  # type: ignore[attr-defined]
    namespace: Any = {
        "type": "namespace",
        "name": "crm",
        "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
    }
    r = sdk.responses.create(model=MODEL_ID, input="hi", tools=[namespace], max_output_tokens=4)
    assert r.tools[0].type == "namespace"
    for bad, param in [
        ({"tools": [{"type": {}}]}, "tools[0].type"),
        ({"tool_choice": {"type": {}}}, "tool_choice.type"),
        ({"text": {"format": {**JSON_FORMAT, "schema": BAD}}}, "text.format.schema"),
        ({"tools": [{**FUNCTION, "parameters": {"items": "abc"}}]}, "tools[0].parameters"),
    ]:  # fmt: skip
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as exc:
                sdk.responses.create(model=MODEL_ID, input="hi", stream=stream, **bad)
            assert exc.value.param == param  # type: ignore[attr-defined]
    with pytest.raises(openai.BadRequestError):
        sdk.responses.input_tokens.count(
            model=MODEL_ID,
            input="hi",
            text={"format": {"type": "json_schema", "name": "x", "schema": {"properties": "abc"}}},  # type: ignore[typeddict-item]
        )
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": "hi"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "array", "items": "abc"}},
            },
        )
    assert exc.value.param == "response_format.json_schema.schema"  # type: ignore[attr-defined]


# -- the fuzz -------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ECHOED)
@FUZZ
@given(data=st.data())
def test_responses_fuzz(sdk: openai.OpenAI, field: str, data: st.DataObject) -> None:
    body = data.draw(bodies(RESPONSES_FIELDS, RESPONSES_BASE, field))
    body.pop("background", None)  # a queued job answers at once; its run is not this test's
    _create(sdk, body)
    _stream(sdk, body)


@pytest.mark.parametrize("field", ["reasoning_effort", "response_format", "tools", "tool_choice"])
@FUZZ
@given(data=st.data())
def test_chat_fuzz(raw: httpx.Client, field: str, data: st.DataObject) -> None:
    body = data.draw(bodies(CHAT_FIELDS, CHAT_BASE, field))
    r = raw.post("/v1/chat/completions", json=body)
    assert r.status_code < 500, r.text
    if r.status_code == 200:
        ChatCompletion.model_validate(r.json())
    s = raw.post("/v1/chat/completions", json={**body, "stream": True})
    assert s.status_code < 500, s.text
    check_stream_end(s.status_code, s.text, chat=True)
    OUTCOMES[f"chat {s.status_code}"] += 1


@pytest.mark.parametrize("field", ["reasoning", "text", "tools", "tool_choice"])
@settings(FUZZ, max_examples=2)
@given(data=st.data())
def test_websocket_fuzz(sdk: openai.OpenAI, field: str, data: st.DataObject) -> None:
    body = data.draw(bodies(RESPONSES_FIELDS, RESPONSES_BASE, field))
    body.pop("background", None)
    with sdk.responses.connect() as conn:
        for _ in range(2):  # the second create proves the socket survived the first
            conn.send({"type": "response.create", **body})
            last = None
            for event in conn:
                last = event.type
                if last in TERMINAL:
                    break
            assert last in TERMINAL, f"the socket closed after {last!r}"
            if last == "error":
                assert event.status < 500  # type: ignore[union-attr]
            OUTCOMES[f"ws {last}"] += 1
