"""`response.steer` over the WebSocket mode, on the app and the fake engine: a steered
response ends `incomplete` (`steered`) and a successor carries the input on; one that
finished first is followed the same way; one waiting for tool output keeps the input for
the client's next create; refusals name their code. Every event is checked against the
SDK's `ResponsesServerEvent`."""

from __future__ import annotations

import time
from typing import Any

import pytest
from openai.types.responses import ResponsesServerEvent
from pydantic import TypeAdapter
from starlette.testclient import TestClient

from respd.api.app import create_app
from respd.engines.fake import FakeEngine, Reply
from respd.store import MemoryStore
from tests.support.fake import FAKE_MODEL
from tests.support.sdk_types import strict_response
from tests.support.servers import TEMPLATES

pytestmark = pytest.mark.waits  # deadlines and delays, run first (see conftest)

EVENTS: TypeAdapter[ResponsesServerEvent] = TypeAdapter(ResponsesServerEvent)
TERMINAL = ("response.completed", "response.incomplete", "response.failed")
LONG = Reply([f"word{i} " for i in range(100)], delay=0.01)


def _app(engine: FakeEngine) -> TestClient:
    return TestClient(create_app(engine, MemoryStore()))


def _receive(ws: Any) -> dict[str, Any]:
    event: dict[str, Any] = ws.receive_json()
    if event.get("error", {}).get("code") == "invalid_input":
        event = {**event, "steer": {**event["steer"], "input": ""}}  # handed back as it was
    EVENTS.validate_python(event)
    return event


def _until(ws: Any, *types: str) -> list[dict[str, Any]]:
    events = []
    while True:
        events.append(_receive(ws))
        if events[-1]["type"] in types:
            return events


def _start(ws: Any, **body: Any) -> str:
    ws.send_json({"type": "response.create", "model": FAKE_MODEL, **body})
    created = _until(ws, "response.created", "error")[-1]
    assert created["type"] == "response.created", created
    return str(created["response"]["id"])


def _steer(ws: Any, target: str, steer_input: Any) -> None:
    ws.send_json({"type": "response.steer", "previous_response_id": target, "input": steer_input})


def test_a_steered_response_stops_when_its_item_is_done_and_a_successor_takes_over() -> None:
    """Steered while thinking: the reasoning item is finished, the answer never begins,
    and the successor answers with the steering input after the steered turn."""
    thought = [f"idea{i} " for i in range(30)]
    thinking = Reply([*thought, "</think>", "Long answer."], delay=0.02)
    template = (TEMPLATES / "think.jinja").read_text()
    answer = Reply(["</think>", "Short answer."])
    engine = FakeEngine([thinking, answer], model_id=FAKE_MODEL, template=template)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        first = _start(ws, input="Write a long story.", store=False, max_output_tokens=1000)
        _until(ws, "response.reasoning_text.delta")
        _steer(ws, first, "Make it short.")
        events = _until(ws, *TERMINAL)
        accepted = [e for e in events if e["type"] == "response.steer.accepted"]
        assert len(accepted) == 1
        steer = accepted[0]["steer"]
        assert steer["previous_response_id"] == first and steer["id"].startswith("steer_")
        numbers = [e["sequence_number"] for e in events]
        assert numbers == list(range(numbers[0], numbers[0] + len(events)))  # in order
        steered = strict_response(events[-1]["response"])
        assert steered.status == "incomplete" and steered.incomplete_details is not None
        assert steered.incomplete_details.reason == "steered"
        # the item being written was finished whole; nothing after it began
        assert [(o.type, o.status) for o in steered.output] == [("reasoning", "completed")]
        assert "Long answer." not in str(events)
        assert engine.calls[0].cancelled  # the generation stopped there
        # the successor: created on its own, from the steered response, with the input
        rest = _until(ws, *TERMINAL)
        assert rest[0]["type"] == "response.created"
        successor = strict_response(rest[-1]["response"])
        assert successor.previous_response_id == first
        assert successor.output_text == "Short answer."
        assert successor.max_output_tokens == 1000  # the settings carry over
        prompt = [(m.role, m.text) for m in engine.calls[-1].prompt.request.messages]
        assert prompt[0] == ("user", "Write a long story.")
        assert prompt[-1] == ("user", "Make it short.")


def test_a_steer_before_any_output_stops_the_response_with_none() -> None:
    engine = FakeEngine([Reply(["never", " shown"], delay=0.5), "Fine."], model_id=FAKE_MODEL)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        first = _start(ws, input="Hi.")
        _steer(ws, first, "Actually, say fine.")
        steered = strict_response(_until(ws, *TERMINAL)[-1]["response"])
        assert steered.status == "incomplete" and steered.output == []
        successor = strict_response(_until(ws, *TERMINAL)[-1]["response"])
        assert successor.output_text == "Fine."


def test_a_message_before_a_call_is_finished_and_the_call_never_starts() -> None:
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    chunks = ["Let", " me", " check", ".", *call]
    engine = FakeEngine([Reply(chunks, delay=0.05), "Okay."], model_id=FAKE_MODEL)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        first = _start(ws, input="Weather?", tools=tools)
        _until(ws, "response.output_text.delta")
        _steer(ws, first, "Never mind.")
        steered = strict_response(_until(ws, *TERMINAL)[-1]["response"])
        assert steered.incomplete_details is not None
        assert steered.incomplete_details.reason == "steered"
        assert [(o.type, o.status) for o in steered.output] == [("message", "completed")]
        assert steered.output_text == "Let me check."
        assert strict_response(_until(ws, *TERMINAL)[-1]["response"]).output_text == "Okay."


def test_a_response_that_ends_first_keeps_its_status_and_is_followed() -> None:
    engine = FakeEngine([Reply(["a", "b", "c"], delay=0.1), "Done."], model_id=FAKE_MODEL)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        first = _start(ws, input="Go.")
        _until(ws, "response.output_text.delta")
        _steer(ws, first, "More.")
        done = strict_response(_until(ws, *TERMINAL)[-1]["response"])
        assert done.status == "completed" and done.output_text == "abc"  # not cut
        successor = strict_response(_until(ws, *TERMINAL)[-1]["response"])
        assert successor.previous_response_id == first and successor.output_text == "Done."


def test_steers_queue_in_order_and_a_late_one_is_refused() -> None:
    engine = FakeEngine([Reply(["a", "b", "c"], delay=0.2), "Done."], model_id=FAKE_MODEL)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        first = _start(ws, input="Go.")
        _steer(ws, first, "One.")
        _steer(ws, first, [{"role": "user", "content": [{"type": "input_text", "text": "Two."}]}])
        events = _until(ws, *TERMINAL)
        assert len([e for e in events if e["type"] == "response.steer.accepted"]) == 2
        successor = strict_response(_until(ws, *TERMINAL)[-1]["response"])
        assert successor.previous_response_id == first
        prompt = [(m.role, m.text) for m in engine.calls[-1].prompt.request.messages]
        assert prompt[-2:] == [("user", "One."), ("user", "Two.")]
        # stored: the successor's input items are the steering messages
        items = client.get(f"/v1/responses/{successor.id}/input_items").json()["data"]
        assert [i["content"][0]["text"] for i in items][::-1] == ["One.", "Two."]
        # a late steer is refused with its reason
        _steer(ws, first, "Too late.")
        (late,) = _until(ws, "response.steer.failed")
        assert late["error"]["code"] == "response_not_active"  # it ended steered
        assert late["steer"]["input"] == "Too late." and "id" not in late["steer"]
        _steer(ws, successor.id, "Later still.")
        (late,) = _until(ws, "response.steer.failed")
        assert late["error"]["code"] == "response_already_completed"


def test_a_response_waiting_for_tool_output_keeps_the_input_for_the_next_create() -> None:
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    engine = FakeEngine([Reply(list(call), delay=0.02), "It is sunny."], model_id=FAKE_MODEL)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        first = _start(ws, input="Weather in Paris?", tools=tools)
        _until(ws, "response.output_item.added")  # the call has begun
        _steer(ws, first, "Answer in French.")
        events = _until(ws, *TERMINAL)
        done = strict_response(events[-1]["response"])
        assert done.status == "completed"  # a call the client owes is never cut
        (fc,) = [o for o in done.output if o.type == "function_call"]
        (pending,) = _until(ws, "response.steer.pending")
        assert pending["reason"] == "waiting_for_required_input"
        assert pending["required_input"] == [
            {"type": "function_call_output", "call_id": fc.call_id, "name": "get_weather"}
        ]
        assert pending["sequence_number"] == events[-1]["sequence_number"] + 1
        output = {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"}
        ws.send_json(
            {
                "type": "response.create",
                "model": FAKE_MODEL,
                "previous_response_id": first,
                "input": [output],
                "tools": tools,
            }
        )
        final = strict_response(_until(ws, *TERMINAL)[-1]["response"])
        assert final.output_text == "It is sunny."
        roles = [m.role for m in engine.calls[-1].prompt.request.messages]
        texts = [m.text for m in engine.calls[-1].prompt.request.messages]
        assert roles[-2:] == ["user", "tool"] and texts[-2] == "Answer in French."


def test_refusals_name_their_code_and_leave_the_socket_open() -> None:
    engine = FakeEngine([LONG, "ok", LONG], model_id=FAKE_MODEL)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        _steer(ws, "resp_nope", "hi")
        (missing,) = _until(ws, "response.steer.failed")
        assert missing["error"]["code"] == "response_not_found"
        first = _start(ws, input="Go on and on.")
        for bad in (
            {"input": ""},
            {"input": []},
            {"input": [{"role": "assistant", "content": "x"}]},
            {"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]},
            {"input": "x", "stream_id": "lane-1"},
        ):
            ws.send_json({"type": "response.steer", "previous_response_id": first, **bad})
            failed = _until(ws, "response.steer.failed")[-1]
            assert failed["error"]["code"] == "invalid_input", bad
            assert failed["error"]["type"] == "invalid_request_error"
        _steer(ws, first, "Stop.")
        _until(ws, *TERMINAL)
        assert _until(ws, *TERMINAL)[-1]["type"] == "response.completed"  # the successor
        # a response bound to a conversation cannot be steered
        conv = client.post("/v1/conversations", json={}).json()["id"]
        bound = _start(ws, input="Go.", conversation=conv)
        _steer(ws, bound, "Stop.")
        refused = _until(ws, "response.steer.failed")[-1]
        assert refused["error"]["code"] == "steering_not_supported"
        assert _until(ws, *TERMINAL)[-1]["type"] == "response.completed"


def test_closing_the_socket_stops_what_runs_and_what_waits() -> None:
    engine = FakeEngine([LONG, "never"], model_id=FAKE_MODEL)
    with _app(engine) as client:
        with client.websocket_connect("/v1/responses") as ws:
            _start(ws, input="Go on and on.")
            ws.send_json({"type": "response.create", "model": FAKE_MODEL, "input": "Next."})
            _until(ws, "response.output_text.delta")
        deadline = time.monotonic() + 5
        while not engine.calls[0].cancelled and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.calls[0].cancelled and len(engine.calls) == 1


def test_a_steer_reaches_a_laned_response_and_its_successor_keeps_the_lane() -> None:
    """A steer names a response on lane `a` while lane `b` runs too: the acceptance, the
    steered end and the successor all carry `a`, and the successor runs before the
    create already waiting on `a`."""

    def respond(prompt: Any, params: Any) -> Reply:
        text = prompt.request.messages[-1].text or ""
        return Reply(["x"] * 40, delay=0.02) if text in ("Go.", "Other.") else Reply([text])

    engine = FakeEngine(respond=respond, model_id=FAKE_MODEL)
    with _app(engine) as client, client.websocket_connect("/v1/responses") as ws:
        first = _start(ws, input="Go.", stream_id="a")
        ws.send_json(
            {"type": "response.create", "model": FAKE_MODEL, "stream_id": "b", "input": "Other."}
        )
        ws.send_json(
            {"type": "response.create", "model": FAKE_MODEL, "stream_id": "a", "input": "Waiting."}
        )
        _steer(ws, first, "Steered.")
        finals: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        while len(finals) < 4:
            events.append(_receive(ws))
            if events[-1]["type"] in TERMINAL:
                finals.append(events[-1])
        (accepted,) = [e for e in events if e["type"] == "response.steer.accepted"]
        assert accepted["stream_id"] == "a"
        on_a = [strict_response(e["response"]) for e in finals if e["stream_id"] == "a"]
        assert [r.status for r in on_a] == ["incomplete", "completed", "completed"]
        assert on_a[0].id == first and on_a[1].previous_response_id == first
        assert [r.output_text for r in on_a[1:]] == ["Steered.", "Waiting."]
        (on_b,) = [strict_response(e["response"]) for e in finals if e["stream_id"] == "b"]
        assert on_b.status == "completed"
        assert all("stream_id" in e for e in events)
