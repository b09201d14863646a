"""`POST /v1/responses` through the real `openai` SDK against a real server and model."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.types.responses import Response

from tests.support.sdk_types import strict_event, strict_response
from tests.support.servers import MODEL_ID, RespdServer


def test_string_input_completes(client: openai.OpenAI, http: httpx.Client) -> None:
    resp = client.responses.create(
        model=MODEL_ID, input="Say hello.", max_output_tokens=24, temperature=0
    )
    assert isinstance(resp, Response)
    assert resp.id.startswith("resp_")
    assert resp.status in ("completed", "incomplete")
    assert resp.output_text.strip()
    msg = resp.output[0]
    assert msg.type == "message" and msg.id.startswith("msg_") and msg.role == "assistant"
    assert resp.usage is not None
    assert resp.usage.input_tokens > 0 and resp.usage.output_tokens > 0
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    assert resp.usage.output_tokens_details.reasoning_tokens == 0
    # The raw wire object carries every required field and echoes the request settings.
    raw = http.post(
        "/v1/responses",
        json={
            "model": MODEL_ID,
            "input": "Hi",
            "max_output_tokens": 8,
            "temperature": 0.5,
            "top_p": 0.9,
            "metadata": {"k": "v"},
            "truncation": "auto",
            "user": "u1",
        },
    ).json()
    strict_response(raw)
    assert raw["temperature"] == 0.5 and raw["top_p"] == 0.9
    assert raw["metadata"] == {"k": "v"} and raw["truncation"] == "auto"
    assert raw["max_output_tokens"] == 8 and raw["model"] == MODEL_ID
    assert raw["store"] is True and raw["background"] is False and raw["user"] == "u1"
    assert raw["text"] == {"format": {"type": "text"}, "verbosity": "medium"}


def test_typed_input_and_instructions_reach_the_model(client: openai.OpenAI) -> None:
    resp = client.responses.create(
        model=MODEL_ID,
        instructions="You are a pirate.",
        input=[
            {"role": "developer", "content": "Answer briefly."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Ahoy!"}]},
            {"role": "user", "content": "How are you?"},
        ],
        max_output_tokens=16,
        temperature=0,
    )
    assert resp.instructions == "You are a pirate."
    assert resp.status in ("completed", "incomplete")
    # Typed history costs more prompt tokens than the last turn alone.
    alone = client.responses.create(
        model=MODEL_ID, input="How are you?", max_output_tokens=1, temperature=0
    )
    assert resp.usage and alone.usage
    assert resp.usage.input_tokens > alone.usage.input_tokens + 10


def test_instructions_become_the_system_turn(client: openai.OpenAI) -> None:
    short = client.responses.create(
        model=MODEL_ID, input="Hi", instructions="Be kind.", max_output_tokens=1
    )
    longer = client.responses.create(
        model=MODEL_ID,
        input="Hi",
        instructions="Be kind. Always answer in French, in one short sentence, politely.",
        max_output_tokens=1,
    )
    assert short.usage and longer.usage
    assert longer.usage.input_tokens > short.usage.input_tokens + 8


def test_seed_and_temperature_zero_are_deterministic(client: openai.OpenAI) -> None:
    outs = {
        client.responses.create(
            model=MODEL_ID, input="Name three colors.", max_output_tokens=20, temperature=0
        ).output_text
        for _ in range(2)
    }
    assert len(outs) == 1
    seeded = {
        client.responses.create(
            model=MODEL_ID,
            input="Write a word.",
            max_output_tokens=12,
            temperature=1.0,
            extra_body={"seed": 1234},
        ).output_text
        for _ in range(2)
    }
    assert len(seeded) == 1


def test_max_output_tokens_gives_incomplete(client: openai.OpenAI) -> None:
    resp = client.responses.create(
        model=MODEL_ID,
        input="Write a long story about a dragon.",
        max_output_tokens=3,
        temperature=0,
    )
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output[0].status == "incomplete"
    assert resp.usage is not None and resp.usage.output_tokens == 3
    assert resp.completed_at is None


def test_stream_sequence_and_final_equals_deltas(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL_ID, input="What is 2+2?", max_output_tokens=100, temperature=0
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == final.output_text
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == deltas
    ids = {e.response.id for e in events if hasattr(e, "response")}
    assert ids == {final.id}
    created = events[0]
    assert created.response.status == "in_progress" and created.response.output == []
    assert created.response.usage is None


def test_stream_raw_events_validate_and_match_nonstream(
    server: RespdServer, client: openai.OpenAI
) -> None:
    body = {
        "model": MODEL_ID,
        "input": "Count: one, two,",
        "max_output_tokens": 12,
        "temperature": 0,
    }
    events = []
    with httpx.stream(
        "POST", server.base_url + "/v1/responses", json={**body, "stream": True}, timeout=120
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers.get("x-request-id")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
                assert name == data["type"], "event: line must name the data's type"
                events.append(data)
    for e in events:
        strict_event(e)
        if "response" in e:
            strict_response(e["response"])
    terminal = events[-1]
    assert terminal["type"] in ("response.completed", "response.incomplete")
    nonstream = client.responses.create(**body)  # type: ignore[arg-type]
    streamed = Response.model_validate(terminal["response"])
    assert streamed.output_text == nonstream.output_text
    assert streamed.status == nonstream.status
    assert [o.type for o in streamed.output] == [o.type for o in nonstream.output]
    assert streamed.usage and nonstream.usage
    assert streamed.usage.output_tokens == nonstream.usage.output_tokens
    # Item ids in the terminal event are those announced during the stream.
    added = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    assert added == [o["id"] for o in terminal["response"]["output"]]


def test_incomplete_stream_ends_with_response_incomplete(client: openai.OpenAI) -> None:
    stream = client.responses.create(
        model=MODEL_ID, input="Write an essay.", max_output_tokens=4, stream=True
    )
    events = list(stream)
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    item_done = [e for e in events if e.type == "response.output_item.done"]
    assert item_done and item_done[0].item.status == "incomplete"


def test_context_overflow_disabled_is_400(client: openai.OpenAI) -> None:
    long_text = "apple banana cherry " * 900  # ~2,700 tokens > the 2,048 window
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model=MODEL_ID, input=long_text, max_output_tokens=16)
    assert exc.value.code == "context_length_exceeded"
    assert exc.value.status_code == 400
    # max_output_tokens alone can overflow the window too.
    with pytest.raises(openai.BadRequestError) as exc2:
        client.responses.create(model=MODEL_ID, input="hi", max_output_tokens=5000)
    assert exc2.value.code == "context_length_exceeded"


def test_context_overflow_auto_drops_oldest_turns(client: openai.OpenAI) -> None:
    filler = "apple banana cherry " * 150  # ~450 tokens per old turn
    history: list[dict[str, str]] = []
    for i in range(6):
        history.append({"role": "user", "content": f"Turn {i}: {filler}"})
        history.append({"role": "assistant", "content": "Noted."})
    history.append({"role": "user", "content": "Say OK."})
    resp = client.responses.create(
        model=MODEL_ID,
        instructions="Be brief.",
        input=history,  # type: ignore[arg-type]
        max_output_tokens=8,
        truncation="auto",
    )
    assert resp.status in ("completed", "incomplete")
    assert resp.truncation == "auto"
    assert resp.usage is not None
    assert resp.usage.input_tokens + 8 <= 2048
    assert resp.usage.input_tokens > 1000  # only the oldest turns went, not everything
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL_ID, input=history, max_output_tokens=8)  # type: ignore[arg-type]


def test_aliases_without_v1(http: httpx.Client) -> None:
    r = http.post("/responses", json={"model": MODEL_ID, "input": "hi", "max_output_tokens": 2})
    assert r.status_code == 200
    strict_response(r.json())
