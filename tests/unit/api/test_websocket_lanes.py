"""WebSocket mode's lanes, limits, `generate: false` and cache eviction, over the app and
the fake engine; every event is validated with the SDK's own server-event types."""

from __future__ import annotations

import time
from typing import Any

import pytest
from openai.types.responses import ResponsesServerEvent
from pydantic import TypeAdapter
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from respd.api.app import create_app
from respd.engines.fake import FakeEngine, Reply
from respd.service.responses.socket_limits import SocketLimits
from respd.store import MemoryStore
from tests.support.fake import FAKE_MODEL
from tests.support.sdk_types import strict_response

pytestmark = pytest.mark.waits  # deadlines and delays, run first (see conftest)

EVENTS: TypeAdapter[ResponsesServerEvent] = TypeAdapter(ResponsesServerEvent)
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")


def _app(engine: FakeEngine, limits: SocketLimits | None = None) -> TestClient:
    return TestClient(create_app(engine, MemoryStore(), socket_limits=limits))


def _recv(ws: Any) -> dict[str, Any]:
    event = ws.receive_json()
    EVENTS.validate_python(event)
    return event


def _until_terminal(ws: Any) -> list[dict[str, Any]]:
    events = []
    while True:
        events.append(_recv(ws))
        if events[-1]["type"] in TERMINAL:
            return events


def _create(ws: Any, **body: Any) -> list[dict[str, Any]]:
    ws.send_json({"type": "response.create", "model": FAKE_MODEL, **body})
    return _until_terminal(ws)


def _send(ws: Any, **body: Any) -> None:
    ws.send_json({"type": "response.create", "model": FAKE_MODEL, **body})


# -- eviction after a failed continuation -------------------------------------------------


def test_a_failed_continuation_evicts_what_it_continued() -> None:
    engine = FakeEngine(["First.", "Fine."], model_id=FAKE_MODEL)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        first = _create(ws, input="hi", store=False)[-1]["response"]["id"]
        bad_output = {"type": "function_call_output", "call_id": "call_unknown", "output": "x"}
        (failed,) = _create(ws, input=[bad_output], store=False, previous_response_id=first)
        assert failed["type"] == "error" and failed["status"] == 400
        assert failed["error"]["param"].endswith("call_id")
        (gone,) = _create(ws, input="again", store=False, previous_response_id=first)
        assert gone["status"] == 404
        assert gone["error"]["code"] == "previous_response_not_found"
        # the socket goes on
        assert _create(ws, input="new chain", store=False)[-1]["type"] == "response.completed"


def test_a_stored_response_still_continues_from_the_store_after_eviction() -> None:
    engine = FakeEngine(["First.", "Again."], model_id=FAKE_MODEL)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        first = _create(ws, input="hi")[-1]["response"]["id"]
        bad_output = {"type": "function_call_output", "call_id": "call_unknown", "output": "x"}
        (failed,) = _create(ws, input=[bad_output], previous_response_id=first)
        assert failed["type"] == "error"
        again = _create(ws, input="again", previous_response_id=first)
        assert again[-1]["type"] == "response.completed"


def test_a_response_that_fails_mid_stream_evicts_its_previous_too() -> None:
    engine = FakeEngine(
        ["First.", Reply(["par"], finish="error", error="engine broke")], model_id=FAKE_MODEL
    )
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        first = _create(ws, input="hi", store=False)[-1]["response"]["id"]
        failed = _create(ws, input="go on", store=False, previous_response_id=first)
        assert failed[-1]["type"] == "response.failed"
        (gone,) = _create(ws, input="again", store=False, previous_response_id=first)
        assert gone["error"]["code"] == "previous_response_not_found"


# -- generate: false ----------------------------------------------------------------------


def test_generate_false_prepares_a_turn_without_output() -> None:
    engine = FakeEngine([Reply(["Hello", " Ada."], cached_tokens=40)], model_id=FAKE_MODEL)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        warm = _create(
            ws, input="My name is Ada.", instructions="Be brief.", store=False, generate=False
        )
        assert [e["type"] for e in warm] == [
            "response.created",
            "response.in_progress",
            "response.completed",
        ]
        done = strict_response(warm[-1]["response"])
        assert done.status == "completed" and done.output == []
        assert done.usage is not None and done.usage.output_tokens == 0
        assert done.usage.input_tokens > 0
        assert len(engine.prewarmed) == 1 and engine.calls == []
        assert engine.prewarmed[0].prompt.n_tokens == done.usage.input_tokens
        # the turn continues from the socket's history (instructions are not carried over,
        # so it repeats them), its prompt as the warmed one began
        nxt = _create(
            ws,
            input="Who am I?",
            instructions="Be brief.",
            store=False,
            previous_response_id=done.id,
        )
        final = strict_response(nxt[-1]["response"])
        assert final.previous_response_id == done.id and final.output_text == "Hello Ada."
        assert final.usage is not None and final.usage.input_tokens_details.cached_tokens == 40
        prompt = [(m.role, m.text) for m in engine.calls[-1].prompt.request.messages]
        assert prompt == [
            ("system", "Be brief."),
            ("user", "My name is Ada."),
            ("user", "Who am I?"),
        ]


def test_generate_false_is_stored_when_asked_and_continues_over_http() -> None:
    engine = FakeEngine(["Later."], model_id=FAKE_MODEL)
    with _app(engine) as client:
        with client.websocket_connect("/v1/responses") as ws:
            warm = _create(ws, input="Remember tea.", generate=False)
        rid = warm[-1]["response"]["id"]
        got = client.get(f"/v1/responses/{rid}").json()
        assert got["status"] == "completed" and got["output"] == []
        r = client.post(
            "/v1/responses",
            json={"model": FAKE_MODEL, "input": "What?", "previous_response_id": rid},
        )
        assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"] == "Later."


def test_prompt_cache_options_prewarm_over_http() -> None:
    engine = FakeEngine([], model_id=FAKE_MODEL)
    with _app(engine) as client:
        body = {"model": FAKE_MODEL, "input": "hi", "prompt_cache_options": {"prewarm": True}}
        r = client.post("/v1/responses", json=body)
        assert r.status_code == 200
        done = strict_response(r.json())
        assert done.status == "completed" and done.output == []
        assert len(engine.prewarmed) == 1 and engine.calls == []


def test_generate_false_refuses_what_a_create_would() -> None:
    engine = FakeEngine([], model_id=FAKE_MODEL)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        (bad,) = _create(ws, input=[{"type": "bogus"}], generate=False)
        assert bad["type"] == "error" and bad["status"] == 400
        (typed,) = _create(ws, input="hi", generate="no")
        assert typed["error"]["param"] == "generate"
        assert engine.prewarmed == []


# -- lanes --------------------------------------------------------------------------------


def test_lanes_run_side_by_side_and_echo_their_stream_id() -> None:
    def respond(prompt: Any, params: Any) -> Reply:
        text = prompt.request.messages[-1].text
        return Reply([f"{text}-{i} " for i in range(4)], delay=0.02)

    engine = FakeEngine(respond=respond, model_id=FAKE_MODEL)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        _send(ws, input="a", stream_id="lane-a", store=False)
        _send(ws, input="b", stream_id="lane.b", store=False)
        events: list[dict[str, Any]] = []
        done: dict[str, dict[str, Any]] = {}
        while len(done) < 2:
            event = _recv(ws)
            events.append(event)
            if event["type"] == "response.completed":
                done[event["stream_id"]] = event["response"]
        assert all(e["stream_id"] in ("lane-a", "lane.b") for e in events)
        # the two responses interleave: lane b began before lane a ended
        order = [e["stream_id"] for e in events]
        assert order.index("lane.b") < len(order) - 1 - order[::-1].index("lane-a")
        assert done["lane-a"]["output"][0]["content"][0]["text"].startswith("a-0")
        # each response's sequence numbers are its own, from 0
        for lane in done:
            seq = [e["sequence_number"] for e in events if e["stream_id"] == lane]
            assert seq == list(range(len(seq)))
        # a new lane forks the chain of another
        fork = _create(ws, input="c", stream_id="fork", previous_response_id=done["lane-a"]["id"])
        assert fork[-1]["response"]["previous_response_id"] == done["lane-a"]["id"]
        assert engine.calls[-1].prompt.request.messages[0].text == "a"


def test_one_lane_runs_its_responses_in_order() -> None:
    engine = FakeEngine(
        [Reply(["one"], delay=0.05), Reply(["two"]), Reply(["three"])], model_id=FAKE_MODEL
    )
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        for text in ("1", "2", "3"):
            _send(ws, input=text, stream_id="main")
        finals = [_until_terminal(ws)[-1] for _ in range(3)]
        assert [f["response"]["output"][0]["content"][0]["text"] for f in finals] == [
            "one",
            "two",
            "three",
        ]
        assert {f["stream_id"] for f in finals} == {"main"}


def test_a_bad_stream_id_is_refused() -> None:
    engine = FakeEngine([], model_id=FAKE_MODEL)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        for bad in ("has space", "", "x" * 257, 5):
            (error,) = _create(ws, input="hi", stream_id=bad)
            assert error["error"]["param"] == "stream_id" and error["status"] == 400


# -- limits -------------------------------------------------------------------------------


def test_active_response_limit() -> None:
    engine = FakeEngine([Reply(["slow", " one"], delay=0.1), "next"], model_id=FAKE_MODEL)
    limits = SocketLimits(active_responses=1)
    with _app(engine, limits) as client, client.websocket_connect("/v1/responses") as ws:
        _send(ws, input="a", stream_id="a")
        _send(ws, input="b", stream_id="b")
        events = []
        while not any(e["type"] == "response.completed" for e in events):
            events.append(_recv(ws))
        (refused,) = [e for e in events if e["type"] == "error"]
        assert refused["status"] == 429 and refused["stream_id"] == "b"
        assert refused["error"]["code"] == "websocket_active_response_limit_reached"
        # room again once it finished
        assert _create(ws, input="c", stream_id="b")[-1]["type"] == "response.completed"


def test_stream_limit() -> None:
    engine = FakeEngine([Reply(["x"], delay=0.1), Reply(["y"]), "z"], model_id=FAKE_MODEL)
    limits = SocketLimits(streams=1)
    with _app(engine, limits) as client, client.websocket_connect("/v1/responses") as ws:
        _send(ws, input="a", stream_id="a")
        _send(ws, input="b", stream_id="b")
        _send(ws, input="a2", stream_id="a")  # the busy lane takes more
        events = []
        while sum(e["type"] == "response.completed" for e in events) < 2:
            events.append(_recv(ws))
        (refused,) = [e for e in events if e["type"] == "error"]
        assert refused["error"]["code"] == "websocket_stream_limit_reached"
        assert refused["error"]["param"] == "stream_id" and refused["stream_id"] == "b"


def test_the_connection_closes_at_its_age_limit() -> None:
    engine = FakeEngine(["ok", "late"], model_id=FAKE_MODEL)
    limits = SocketLimits(max_age=0.5)
    with _app(engine, limits) as client, client.websocket_connect("/v1/responses") as ws:
        assert _create(ws, input="hi")[-1]["type"] == "response.completed"
        time.sleep(0.6)
        error = _recv(ws)
        assert error["type"] == "error"
        assert error["error"]["code"] == "websocket_connection_limit_reached"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1000


# -- fields that only mean something over HTTP ------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("stream", False), ("stream_options", {"include_obfuscation": False}), ("background", True)],
)
def test_http_only_fields_are_refused(field: str, value: Any) -> None:
    engine = FakeEngine([], model_id=FAKE_MODEL)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        (error,) = _create(ws, input="hi", stream_id="s", **{field: value})
        assert error["type"] == "error" and error["status"] == 400
        assert error["error"]["param"] == field
        assert error["error"]["code"] == "unsupported_parameter" and error["stream_id"] == "s"


def test_stream_true_and_background_false_are_what_the_socket_does() -> None:
    engine = FakeEngine(["ok"], model_id=FAKE_MODEL)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        done = _create(ws, input="hi", stream=True, background=False)
        assert done[-1]["type"] == "response.completed"
        assert done[-1]["response"]["background"] is False


def test_a_client_that_goes_away_stops_every_lane(caplog: pytest.LogCaptureFixture) -> None:
    slow = [f"w{i} " for i in range(200)]
    engine = FakeEngine([Reply(slow, delay=0.01), Reply(slow, delay=0.01)], model_id=FAKE_MODEL)
    with _app(engine) as client:
        with client.websocket_connect("/v1/responses") as ws:
            _send(ws, input="a", stream_id="a")
            _send(ws, input="b", stream_id="b")
            seen: set[str] = set()
            while seen != {"a", "b"}:
                event = _recv(ws)
                if event["type"] == "response.output_text.delta":
                    seen.add(event["stream_id"])
        deadline = time.monotonic() + 5
        while not all(c.cancelled for c in engine.calls) and time.monotonic() < deadline:
            time.sleep(0.02)
    assert len(engine.calls) == 2 and all(c.cancelled for c in engine.calls)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
