"""`response.steer` against the real server and model, sent with the `openai` SDK's own
`connection.response.steer(...)`: a running answer is steered and a successor carries the
input on; a response that stops for a client tool call keeps the input for the client's
next create. Every event is validated with the SDK's `ResponsesServerEvent`."""

from __future__ import annotations

from typing import Any

import httpx
import openai
from openai.types.responses import ResponsesServerEvent
from openai.types.responses.response_steer_accepted_event import Steer as AcceptedSteer
from pydantic import TypeAdapter

from tests.support.sdk_types import strict_response
from tests.support.servers import MODEL_ID

EVENTS: TypeAdapter[ResponsesServerEvent] = TypeAdapter(ResponsesServerEvent)
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


def _next(conn: Any) -> Any:
    event = conn.recv()
    EVENTS.validate_python(event.model_dump(mode="json", exclude_unset=True))
    return event


def _until(conn: Any, types: set[str]) -> list[Any]:
    events = [_next(conn)]
    while events[-1].type not in types:
        events.append(_next(conn))
    return events


def _final(event: Any) -> Any:
    return strict_response(event.response.model_dump(mode="json", exclude_unset=True))


# A long prompt: its prefill outlasts the steer's trip, so the steer lands before the
# answer's first token.
NOTES = "Summarize these notes.\n" + "The meeting covered budgets, hiring and the roadmap. " * 50
# Another, for the HTTP case: a prefix the WebSocket case cached would make its prefill fast.
MINUTES = "Summarize these minutes.\n" + "The review covered costs, staffing and the plan. " * 50


def test_a_steered_response_stops_and_its_successor_takes_the_input(
    client: openai.OpenAI,
) -> None:
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL_ID, input=NOTES, max_output_tokens=200)
        first = _until(conn, {"response.created"})[-1].response.id
        conn.response.steer(previous_response_id=first, input="Just say: done.")
        events = _until(conn, TERMINAL)
        (accepted,) = [e for e in events if e.type == "response.steer.accepted"]
        assert accepted.steer.previous_response_id == first
        assert accepted.steer.id.startswith("steer_")
        steered = _final(events[-1])
        assert steered.status == "incomplete", steered.status
        assert steered.incomplete_details.reason == "steered"
        assert steered.output == []  # stopped before its answer began
        assert "response.output_text.delta" not in [e.type for e in events]
        # the successor comes on its own, from the steered response, with its settings
        rest = _until(conn, TERMINAL)
        assert rest[0].type == "response.created"
        successor = _final(rest[-1])
        assert successor.previous_response_id == first
        assert successor.max_output_tokens == 200
        assert successor.status in ("completed", "incomplete") and successor.output_text
    items = client.responses.input_items.list(successor.id).data
    assert [i.content[0].text for i in items] == ["Just say: done."]  # type: ignore[union-attr]
    # its prompt holds the steered turn's input, then the steering input
    assert successor.usage.input_tokens > steered.usage.input_tokens


def test_input_waits_while_a_tool_call_is_owed(client: openai.OpenAI) -> None:
    tools: list[Any] = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ]
    with client.responses.connect() as conn:
        conn.response.create(
            model=MODEL_ID,
            input="What is the weather in Paris?",
            tools=tools,
            tool_choice="required",
            max_output_tokens=80,
        )
        first = _until(conn, {"response.created"})[-1].response.id
        _until(conn, {"response.output_item.added"})  # the call has begun
        conn.response.steer(
            previous_response_id=first,
            input=[{"type": "message", "role": "user", "content": "Answer in French."}],
        )
        events = _until(conn, TERMINAL)
        assert [e.type for e in events].count("response.steer.accepted") == 1
        done = _final(events[-1])
        assert done.status == "completed", done.output  # a call the client owes is never cut
        (call,) = [o for o in done.output if o.type == "function_call"]
        (pending,) = _until(conn, {"response.steer.pending"})
        assert pending.reason == "waiting_for_required_input"
        (stub,) = pending.required_input
        assert (stub.type, stub.call_id, stub.name) == (
            "function_call_output",
            call.call_id,
            "get_weather",
        )
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny."}
        conn.response.create(
            model=MODEL_ID,
            previous_response_id=first,
            input=[output],  # type: ignore[list-item]
            tools=tools,
            max_output_tokens=30,
        )
        final = _final(_until(conn, TERMINAL)[-1])
        assert final.previous_response_id == first
    items = client.responses.input_items.list(final.id, order="asc").data
    assert [i.type for i in items] == ["message", "function_call_output"]
    assert items[0].content[0].text == "Answer in French."  # type: ignore[union-attr]
    # a steer for a response that is gone is refused with its reason, not silently lost
    with client.responses.connect() as conn:
        conn.response.steer(previous_response_id=first, input="Anything?")
        (failed,) = _until(conn, {"response.steer.failed"})
        assert failed.error.code == "response_not_found" and failed.steer.input == "Anything?"


def test_an_http_stream_is_steered_by_post(client: openai.OpenAI) -> None:
    """Over HTTP: `POST /v1/responses/{id}/steer` reaches a response streaming on another
    request; its stream then carries the acceptance, the steered end, and the successor."""
    stream = client.responses.create(
        model=MODEL_ID, input=MINUTES, max_output_tokens=200, stream=True
    )
    events = iter(stream)
    created = next(events)
    assert created.type == "response.created"
    first = created.response.id
    with httpx.Client(base_url=str(client.base_url), timeout=60) as http:
        r = http.post(f"responses/{first}/steer", json={"input": "Just say: done."})
        assert r.status_code == 200, r.text
        accepted = AcceptedSteer.model_validate(r.json())
        assert accepted.previous_response_id == first and accepted.id.startswith("steer_")
        rest = [
            EVENTS.validate_python(e.model_dump(mode="json", exclude_unset=True)) for e in events
        ]
        types = [e.type for e in rest]
        (notice,) = [e for e in rest if e.type == "response.steer.accepted"]
        assert notice.steer.id == accepted.id
        # the steered response ends, then its successor runs in the same stream
        ends = [i for i, t in enumerate(types) if t in TERMINAL]
        assert len(ends) == 2 and types[ends[0] + 1] == "response.created"
        steered = strict_response(rest[ends[0]].response.model_dump(mode="json"))
        assert steered.id == first and steered.status == "incomplete"
        assert steered.incomplete_details and steered.incomplete_details.reason == "steered"
        successor = strict_response(rest[-1].response.model_dump(mode="json"))
        assert successor.previous_response_id == first and successor.output_text
        # stored as any response: the steered one and its successor, readable over HTTP
        assert client.responses.retrieve(first).incomplete_details.reason == "steered"  # type: ignore[union-attr]
        items = client.responses.input_items.list(successor.id).data
        assert [i.content[0].text for i in items] == ["Just say: done."]  # type: ignore[union-attr]
        # refusals are OpenAI errors with the steering code and a fitting status
        done = http.post(f"responses/{first}/steer", json={"input": "More."})
        assert done.status_code == 409
        assert done.json()["error"]["code"] in ("response_already_completed", "response_not_active")
        missing = http.post("responses/resp_nothing/steer", json={"input": "Hi."})
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "response_not_found"
        whole = client.responses.create(model=MODEL_ID, input="Hi.", max_output_tokens=8)
        unstreamed = http.post(f"responses/{whole.id}/steer", json={"input": "Hi."})
        assert unstreamed.status_code == 404  # a response returned whole has no stream to steer
        bad = http.post(
            f"responses/{first}/steer",
            json={"input": [{"role": "assistant", "content": "No."}]},
        )
        assert bad.status_code in (400, 409)
