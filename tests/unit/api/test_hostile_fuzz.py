"""Property fuzz over every echoed field and tool/schema shape of both APIs, in process
over the fake engine: no 5xx, every 4xx in OpenAI's error shape, every 200 a valid
Response (by the SDK's types), every stream ended by a terminal event (or `[DONE]`), and
every WebSocket create answered through to a terminal or `error` event on a socket that
stays open."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from respd.api.app import create_app
from respd.engines.fake import FakeEngine, Reply
from tests.support.fake import FAKE_MODEL
from tests.support.hostile import (
    CHAT_FIELDS,
    RESPONSES_FIELDS,
    TERMINAL,
    bodies,
    check_stream_end,
    sse_data,
)
from tests.support.sdk_types import strict_event, strict_response

# A sixth of the profile's examples per field (43 properties, over 200 bodies on the quick
# profile, over 1,000 on the thorough one).
FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    max_examples=max(5, settings().max_examples // 6),
)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    engine = FakeEngine(model_id=FAKE_MODEL, respond=lambda prompt, params: Reply(["hi"]))
    with TestClient(create_app(engine), raise_server_exceptions=False) as tc:
        yield tc


def _check_error(status: int, body: Any) -> None:
    assert status < 500, body
    if status >= 400:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body


RESPONSES_BASE = {"model": FAKE_MODEL, "input": "hi"}
CHAT_BASE = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("field", sorted(RESPONSES_FIELDS))
@FUZZ
@given(data=st.data())
def test_responses_never_5xx_and_streams_always_end(
    client: TestClient, field: str, data: st.DataObject
) -> None:
    body = data.draw(bodies(RESPONSES_FIELDS, RESPONSES_BASE, field))
    r = client.post("/v1/responses", json=body)
    _check_error(r.status_code, r.json())
    if r.status_code == 200:
        strict_response(r.json())
    s = client.post("/v1/responses", json={**body, "stream": True})
    if s.status_code != 200:
        _check_error(s.status_code, s.json())
    check_stream_end(s.status_code, s.text, chat=False)
    if s.status_code == 200:
        for event in sse_data(s.text):
            if event["type"] != "error":
                strict_event(event)


@pytest.mark.parametrize("field", ["reasoning", "text", "tools", "tool_choice", "truncation"])
@FUZZ
@given(data=st.data())
def test_input_token_counts_never_5xx(client: TestClient, field: str, data: st.DataObject) -> None:
    body = data.draw(bodies(RESPONSES_FIELDS, RESPONSES_BASE, field))
    r = client.post("/v1/responses/input_tokens", json=body)
    _check_error(r.status_code, r.json())


@pytest.mark.parametrize("field", sorted(CHAT_FIELDS))
@FUZZ
@given(data=st.data())
def test_chat_never_5xx_and_streams_always_end(
    client: TestClient, field: str, data: st.DataObject
) -> None:
    body = data.draw(bodies(CHAT_FIELDS, CHAT_BASE, field))
    r = client.post("/v1/chat/completions", json=body)
    _check_error(r.status_code, r.json())
    s = client.post("/v1/chat/completions", json={**body, "stream": True})
    if s.status_code != 200:
        _check_error(s.status_code, s.json())
    check_stream_end(s.status_code, s.text, chat=True)


@pytest.mark.parametrize("field", ["reasoning", "text", "tools", "tool_choice"])
@settings(FUZZ, max_examples=max(3, settings().max_examples // 10))
@given(data=st.data())
def test_websocket_creates_always_end_and_the_socket_stays(
    client: TestClient, field: str, data: st.DataObject
) -> None:
    body = data.draw(bodies(RESPONSES_FIELDS, RESPONSES_BASE, field))
    with client.websocket_connect("/v1/responses") as ws:
        for _ in range(2):  # the second create proves the socket survived the first
            ws.send_json({"type": "response.create", **body})
            while (event := ws.receive_json())["type"] not in TERMINAL:
                assert event["type"].startswith("response."), event
            if event["type"] == "error":
                assert event["status"] < 500, event
