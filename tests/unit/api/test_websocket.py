"""The Responses WebSocket mode over the app and the fake engine: sequential responses on
one socket, `store: false` continuations from the socket's own history, error events that
leave the socket open, and the same key and origin checks as HTTP."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import ResponsesServerEvent
from pydantic import TypeAdapter
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from respd.api.app import create_app
from respd.api.guard import GuardSettings
from respd.api.identity import KeyRing
from respd.engines.fake import FakeEngine
from respd.store import MemoryStore
from tests.support.fake import FAKE_MODEL
from tests.support.sdk_types import strict_response

EVENTS: TypeAdapter[ResponsesServerEvent] = TypeAdapter(ResponsesServerEvent)


def _app(engine: FakeEngine, **kw: Any) -> TestClient:
    return TestClient(create_app(engine, MemoryStore(), **kw))


def _until_terminal(ws: Any) -> list[dict[str, Any]]:
    events = []
    while True:
        event = ws.receive_json()
        EVENTS.validate_python(event)
        events.append(event)
        if event["type"] in (
            "response.completed",
            "response.incomplete",
            "response.failed",
            "error",
        ):
            return events


def _create(ws: Any, **body: Any) -> list[dict[str, Any]]:
    ws.send_json({"type": "response.create", "model": FAKE_MODEL, **body})
    return _until_terminal(ws)


def test_responses_follow_one_another_and_continue_without_a_store() -> None:
    engine = FakeEngine(["First answer.", "Second answer.", "Third."], model_id=FAKE_MODEL)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        first = _create(ws, input="one", store=False)
        assert [e["sequence_number"] for e in first] == list(range(len(first)))
        done = strict_response(first[-1]["response"])
        assert done.output_text == "First answer."
        second = _create(ws, input="two", store=False, previous_response_id=done.id)
        assert second[-1]["type"] == "response.completed"
        prompt = [(m.role, m.text) for m in engine.calls[-1].prompt.request.messages]
        assert prompt == [("user", "one"), ("assistant", "First answer."), ("user", "two")]
        # a chain of two, from the socket's history alone
        third = _create(
            ws, input="three", store=False, previous_response_id=second[-1]["response"]["id"]
        )
        assert third[-1]["type"] == "response.completed"
        assert len(engine.calls[-1].prompt.request.messages) == 5
    # not stored: gone with the socket
    assert client.get(f"/v1/responses/{done.id}").status_code == 404


def test_bad_messages_are_error_events_and_the_socket_goes_on() -> None:
    engine = FakeEngine(["ok"], model_id=FAKE_MODEL)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        for message, code in (
            ("not json", "invalid_json"),
            ('{"type": "session.update"}', "invalid_value"),
            ('{"type": "response.create", "input": "hi"}', "missing_required_parameter"),
        ):
            ws.send_text(message)
            (error,) = _until_terminal(ws)
            assert error["type"] == "error" and error["status"] == 400
            assert error["error"]["code"] == code
        (missing,) = _create(ws, input="hi", previous_response_id="resp_nope")
        assert missing["status"] == 404
        assert missing["error"]["code"] == "previous_response_not_found"
        assert _create(ws, input="hi")[-1]["type"] == "response.completed"


def test_after_a_reconnect_only_stored_responses_continue() -> None:
    engine = FakeEngine(["a", "b", "c"], model_id=FAKE_MODEL)
    with _app(engine) as client:
        with client.websocket_connect("/v1/responses") as ws:
            kept = _create(ws, input="kept")[-1]["response"]["id"]
            lost = _create(ws, input="lost", store=False)[-1]["response"]["id"]
        with client.websocket_connect("/v1/responses") as ws:
            (gone,) = _create(ws, input="x", store=False, previous_response_id=lost)
            assert gone["error"]["code"] == "previous_response_not_found"
            again = _create(ws, input="x", previous_response_id=kept)
            assert again[-1]["type"] == "response.completed"


def test_keys_and_origins_are_checked_before_the_socket_opens() -> None:
    engine = FakeEngine(["ok"], model_id=FAKE_MODEL)
    guard = GuardSettings(allowed_hosts=["testserver"], cors_origins=[])
    with _app(engine, keys=KeyRing(["sk-good"]), guard=guard) as client:
        for headers in (
            {},
            {"authorization": "Bearer sk-bad"},
            {"authorization": "Bearer sk-good", "origin": "http://evil.example"},
        ):
            with (
                pytest.raises(WebSocketDisconnect),
                client.websocket_connect("/v1/responses", headers=headers) as ws,
            ):
                ws.receive_json()
        headers = {"authorization": "Bearer sk-good"}
        with client.websocket_connect("/v1/responses", headers=headers) as ws:
            assert _create(ws, input="hi")[-1]["type"] == "response.completed"
    assert len(engine.calls) == 1
