"""A failure after a response's first event never cuts it: an HTTP stream ends with
`response.failed` (or, when even that cannot be built, an `error` event), a WebSocket
response with one of them, and the socket goes on. Nothing is stored half-way."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from respd.api.app import create_app
from respd.engines.fake import FakeEngine, Reply
from respd.service.chat.service import ChatService
from respd.service.responses.events import ResponseEventMachine
from respd.store import MemoryStore
from respd.store.base import JSON, ResponseRecord
from tests.support.fake import FAKE_MODEL
from tests.support.sdk_types import strict_event


class BrokenStore(MemoryStore):
    """A store that cannot save a response (a full disk, a lost database)."""

    async def save_response(
        self,
        record: ResponseRecord,
        *,
        conversation: tuple[str, list[JSON]] | None = None,
        events: list[JSON] | None = None,
        worker: str | None = None,
    ) -> bool:
        raise RuntimeError("the disk is full")


def _client() -> TestClient:
    engine = FakeEngine(model_id=FAKE_MODEL, respond=lambda prompt, params: Reply(["hi"]))
    return TestClient(create_app(engine, BrokenStore()), raise_server_exceptions=False)


def _sse_events(text: str) -> list[dict[str, Any]]:
    return [
        json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")
    ]


def _break_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(self: ResponseEventMachine, message: str, *, code: str = "") -> Any:
        raise RuntimeError("cannot even fail")

    monkeypatch.setattr(ResponseEventMachine, "fail", fail)


BODY = {"model": FAKE_MODEL, "input": "hi"}


def test_a_stream_whose_store_breaks_ends_failed() -> None:
    r = _client().post("/v1/responses", json={**BODY, "stream": True})
    assert r.status_code == 200
    events = _sse_events(r.text)
    for event in events:
        strict_event(event)
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_a_stream_that_cannot_even_fail_ends_with_an_error_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _break_failing(monkeypatch)
    r = _client().post("/v1/responses", json={**BODY, "stream": True})
    events = _sse_events(r.text)
    assert events[0]["type"] == "response.created"
    assert events[-1] == {
        "type": "error",
        "code": "server_error",
        "message": "The server had an error while processing your request.",
        "param": None,
    }
    assert "event: error" in r.text


def test_an_answer_whose_store_breaks_is_a_failed_response_not_a_500() -> None:
    r = _client().post("/v1/responses", json=BODY)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "failed"


@pytest.mark.parametrize("even_failing_breaks", [False, True])
def test_a_socket_response_that_breaks_ends_with_a_word_and_the_socket_goes_on(
    monkeypatch: pytest.MonkeyPatch, even_failing_breaks: bool
) -> None:
    if even_failing_breaks:
        _break_failing(monkeypatch)
    with _client().websocket_connect("/v1/responses") as ws:
        for _ in range(2):
            ws.send_json({"type": "response.create", **BODY})
            while (event := ws.receive_json())["type"] not in ("response.failed", "error"):
                assert event["type"] != "response.completed"
            if even_failing_breaks:
                assert event["type"] == "error" and event["status"] == 500
                assert event["error"]["code"] == "server_error"
            else:
                assert event["response"]["status"] == "failed"


def test_a_chat_stream_that_breaks_ends_with_an_error_chunk_and_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("broken chunk")

    monkeypatch.setattr(ChatService, "text_chunk", broken)
    body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    r = _client().post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    frames = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert frames[-1] == "data: [DONE]"
    assert json.loads(frames[-2][len("data: ") :])["error"]["code"] == "server_error"
