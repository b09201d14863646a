"""The Open Responses compliance cases, as this project's own tests: each case's request
sent to a real server and its answer validated against the Open Responses OpenAPI
document (tests/data/openresponses-openapi.json, a copy: the suite itself is not on any
package registry), plus the newer cases — `phase`, compaction — and the WebSocket ones.

The cases' semantic checks are kept; where the 135M model decides (does it call the
weather tool when it may?), the call is forced, so that what is checked is the protocol.
No request bounds its output: the server's own guards (DRY, the repetition stop, the
default output cap) end every turn.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tests.support.gguf.llava import png_bytes, write_projector
from tests.support.servers import MODEL_ID, RespdServer, start_server

DOC = json.loads((Path(__file__).parents[1] / "data" / "openresponses-openapi.json").read_text())
_REGISTRY = Registry().with_resource(
    "urn:openresponses", Resource.from_contents(DOC, default_specification=DRAFT202012)
)
_STREAM = DOC["paths"]["/responses"]["post"]["responses"]["200"]["content"]["text/event-stream"]
# Event types the document defines, each with its schema.
EVENT_SCHEMAS = {
    DOC["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]["properties"]["type"]["enum"][
        0
    ]: ref["$ref"]
    for ref in _STREAM["schema"]["oneOf"]
}


def schema_errors(instance: Any, ref: str) -> list[str]:
    validator = Draft202012Validator({"$ref": "urn:openresponses" + ref}, registry=_REGISTRY)
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(instance)
    ]


def check_resource(body: Any) -> dict[str, Any]:
    errors = schema_errors(body, "#/components/schemas/ResponseResource")
    assert not errors, errors[:5]
    assert isinstance(body, dict)
    return body


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a location",
    "parameters": {
        "type": "object",
        "properties": {
            "location": {
                "type": "string",
                "description": "The city and state, e.g. San Francisco, CA",
            }
        },
        "required": ["location"],
    },
}
SF = [{"type": "message", "role": "user", "content": "What's the weather like in San Francisco?"}]


def finished(body: dict[str, Any]) -> bool:
    """The cases ask for `completed`; the 135M model may instead talk until the server's
    default output cap (or its repetition stop) ends the turn, the other well-formed end."""
    if body["status"] == "completed":
        return True
    return body["status"] == "incomplete" and body["incomplete_details"] == {
        "reason": "max_output_tokens"
    }


def _post(http: httpx.Client, **body: Any) -> dict[str, Any]:
    r = http.post("/v1/responses", json={"model": MODEL_ID, **body})
    assert r.status_code == 200, r.text
    return check_resource(r.json())


def _stream(http: httpx.Client, **body: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    body = {"model": MODEL_ID, "stream": True, **body}
    events = []
    with http.stream("POST", "/v1/responses", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    for event in events:
        if event["type"] in EVENT_SCHEMAS:  # the document's events, by its schemas
            errors = schema_errors(event, EVENT_SCHEMAS[event["type"]])
            assert not errors, (event["type"], errors[:3])
    assert events and events[-1]["type"] in ("response.completed", "response.incomplete")
    return events, check_resource(events[-1]["response"])


def test_basic_response(http: httpx.Client) -> None:
    body = _post(
        http,
        input=[{"type": "message", "role": "user", "content": "Say hello in exactly 3 words."}],
    )
    assert body["output"] and finished(body)


def test_streaming_response(http: httpx.Client) -> None:
    events, final = _stream(
        http,
        input=[{"type": "message", "role": "user", "content": "Count from 1 to 5."}],
    )
    types = [e["type"] for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in types and finished(final)


def test_system_prompt(http: httpx.Client) -> None:
    body = _post(
        http,
        input=[
            {
                "type": "message",
                "role": "system",
                "content": "You are a pirate. Always respond in pirate speak.",
            },
            {"type": "message", "role": "user", "content": "Say hello."},
        ],
    )
    assert body["output"] and finished(body)


def test_tool_calling(http: httpx.Client) -> None:
    body = _post(http, input=SF, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    assert [o["type"] for o in body["output"]] == ["function_call"]


def test_tool_calling_streaming(http: httpx.Client) -> None:
    events, final = _stream(
        http, input=SF, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False
    )
    types = [e["type"] for e in events]
    added = [e for e in events if e["type"] == "response.output_item.added"]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert any(e["item"]["type"] == "function_call" for e in added)
    assert "response.function_call_arguments.delta" in types
    assert "response.function_call_arguments.done" in types
    assert any(e["item"]["type"] == "function_call" for e in done)
    assert final["output"][0]["type"] == "function_call"


def test_multi_turn(http: httpx.Client) -> None:
    body = _post(
        http,
        input=[
            {"type": "message", "role": "user", "content": "My name is Alice."},
            {
                "type": "message",
                "role": "assistant",
                "content": "Hello Alice! Nice to meet you. How can I help you today?",
            },
            {"type": "message", "role": "user", "content": "What is my name?"},
        ],
    )
    assert body["output"] and finished(body)


def test_phase_on_assistant_messages(http: httpx.Client) -> None:
    """Assistant messages carry `phase` (commentary, final_answer) in a replayed history."""
    body = _post(
        http,
        input=[
            {"type": "message", "role": "user", "content": "Check the weather, then tell me."},
            {
                "type": "message",
                "role": "assistant",
                "phase": "commentary",
                "content": [{"type": "output_text", "text": "Checking the weather."}],
            },
            {
                "type": "message",
                "role": "assistant",
                "phase": "final_answer",
                "content": [{"type": "output_text", "text": "It is sunny."}],
            },
            {"type": "message", "role": "user", "content": "Thanks!"},
        ],
    )
    assert body["output"]
    # the stored input keeps each phase; the answer that ends the response is marked final
    items = http.get(f"/v1/responses/{body['id']}/input_items", params={"order": "asc"}).json()
    assert [i.get("phase") for i in items["data"]] == [None, "commentary", "final_answer", None]
    messages = [o for o in body["output"] if o["type"] == "message"]
    assert messages and messages[-1]["phase"] == "final_answer"
    bad = http.post(
        "/v1/responses",
        json={
            "model": MODEL_ID,
            "input": [{"role": "assistant", "phase": "draft", "content": "x"}],
        },
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[0].phase"


def test_compaction(http: httpx.Client) -> None:
    first = _post(http, input="My name is Alice and I like tea.")
    r = http.post(
        "/v1/responses/compact",
        json={"model": MODEL_ID, "previous_response_id": first["id"], "input": "Noted?"},
    )
    assert r.status_code == 200, r.text
    compacted = r.json()
    errors = schema_errors(compacted, "#/components/schemas/CompactResource")
    assert not errors, errors[:5]
    # the history's user messages, as they were sent, then the item for all of it
    *kept, item = compacted["output"]
    assert [(m["role"], m["content"][0]["text"]) for m in kept] == [
        ("user", "My name is Alice and I like tea."),
        ("user", "Noted?"),
    ]
    assert item["type"] == "compaction" and item["encrypted_content"]
    # the compacted history continues, handed back as it came
    follow = {"type": "message", "role": "user", "content": "Go on."}
    body = _post(http, input=[*compacted["output"], follow])
    assert body["output"]
    # a compaction body without a model is a 400 naming it
    missing = http.post("/v1/responses/compact", json={"input": "hi"})
    assert missing.status_code == 400
    assert missing.json()["error"]["param"] == "model"
    bad = http.post("/v1/responses/compact", json={"model": MODEL_ID, "input": [{"type": "x"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[0].type"


def test_compaction_trigger_turn(http: httpx.Client) -> None:
    """The history ending in `compaction_trigger` on /v1/responses (as Codex sends it): one
    `compaction` output item in a completed stream, which then stands for the history."""
    history = [
        {"type": "message", "role": "user", "content": "My name is Alice and I like tea."},
        {"type": "message", "role": "assistant", "content": "Nice to meet you, Alice."},
    ]
    events, final = _stream(http, input=[*history, {"type": "compaction_trigger"}], store=False)
    assert final["status"] == "completed"
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in done] == ["compaction"] and done[0]["encrypted_content"]
    assert [o["type"] for o in final["output"]] == ["compaction"]
    # progress while the summary is sampled, for the item announced before it
    types = [e["type"] for e in events]
    added, finished_at = (
        types.index("response.output_item.added"),
        types.index("response.output_item.done"),
    )
    compacting = [i for i, t in enumerate(types) if t == "response.compaction.compacting"]
    assert compacting and all(added < i < finished_at for i in compacting)  # one per 30 s
    assert {(events[i]["item_id"], events[i]["output_index"]) for i in compacting} == {
        (done[0]["id"], 0)
    }
    body = _post(http, input=[history[0], done[0], {"role": "user", "content": "Go on."}])
    assert finished(body)
    late = http.post(
        "/v1/responses",
        json={"model": MODEL_ID, "input": [{"type": "compaction_trigger"}, *history]},
    )
    assert late.status_code == 400 and late.json()["error"]["param"] == "input[0]"


def test_context_management_compaction(http: httpx.Client) -> None:
    """`context_management` compaction: past its threshold the turns before the last user
    turn become a compaction item, first in the output, and the answer goes on from it."""
    history = [
        {"type": "message", "role": "user", "content": "My name is Alice and I like tea."},
        {"type": "message", "role": "assistant", "content": "Nice to meet you, Alice."},
        {"type": "message", "role": "user", "content": "What do I like?"},
    ]
    body = _post(
        http,
        input=history,
        context_management=[{"type": "compaction", "compact_threshold": 20}],
    )
    assert finished(body)
    assert body["output"][0]["type"] == "compaction" and len(body["output"]) > 1
    assert body["usage"]["input_tokens"] > 0
    # streamed, the summary is made in the stream: the item, its progress, then the answer
    events, final = _stream(
        http,
        input=history,
        context_management=[{"type": "compaction", "compact_threshold": 20}],
    )
    types = [e["type"] for e in events]
    assert types[2:5] == [
        "response.output_item.added",
        "response.compaction.compacting",
        "response.output_item.done",
    ]
    assert events[4]["item"]["type"] == "compaction" and events[4]["item"]["encrypted_content"]
    assert finished(final) and final["output"][0]["type"] == "compaction"


@pytest.fixture(scope="module")
def vision(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    mmproj = write_projector(tmp_path_factory.mktemp("or-mmproj") / "mmproj.gguf")
    srv = start_server(
        tmp_path_factory.mktemp("respd-or-vision"), "--ctx-size", "1024", "--mmproj", str(mmproj)
    )
    yield srv
    srv.stop()
    srv.assert_no_5xx()


def test_image_input(vision: RespdServer) -> None:
    """The case's image as a data URI (the machines reach no web), on the vision fixture."""
    uri = "data:image/png;base64," + base64.b64encode(png_bytes((220, 30, 30))).decode()
    with httpx.Client(base_url=vision.base_url, timeout=120) as http:
        body = _post(
            http,
            input=[
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {
                            "type": "input_text",
                            "text": "What do you see in this image? Answer in one sentence.",
                        },
                        {"type": "input_image", "image_url": uri},
                    ],
                }
            ],
        )
    assert body["output"]


# -- WebSocket mode ---------------------------------------------------------------------


def _ws_turn(conn: Any, **body: Any) -> list[dict[str, Any]]:
    conn.send({"type": "response.create", "model": MODEL_ID, **body})
    events = []
    for event in conn:
        events.append(event.model_dump(mode="json", exclude_unset=True))
        if event.type in ("response.completed", "response.incomplete", "response.failed", "error"):
            return events
    raise AssertionError("the socket closed early")


def _ws_events_valid(events: list[dict[str, Any]]) -> dict[str, Any]:
    for event in events:
        if event["type"] in EVENT_SCHEMAS:
            errors = schema_errors(event, EVENT_SCHEMAS[event["type"]])
            assert not errors, (event["type"], errors[:3])
    return check_resource(events[-1]["response"])


def test_ws_basic_response(client: openai.OpenAI) -> None:
    with client.responses.connect() as conn:
        final = _ws_events_valid(_ws_turn(conn, input="Say hello in exactly 3 words."))
        assert final["output"]


def test_ws_sequential_responses_on_one_socket(client: openai.OpenAI) -> None:
    with client.responses.connect() as conn:
        ids = [_ws_events_valid(_ws_turn(conn, input=f"Say {n}."))["id"] for n in (1, 2, 3)]
        assert len(set(ids)) == 3


def test_ws_store_false_continuation(client: openai.OpenAI) -> None:
    with client.responses.connect() as conn:
        first = _ws_events_valid(_ws_turn(conn, input="My name is Alice.", store=False))
        second = _ws_events_valid(
            _ws_turn(conn, input="What is my name?", store=False, previous_response_id=first["id"])
        )
        assert second["previous_response_id"] == first["id"]
        assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"]


def test_ws_continuation_after_reconnect_is_not_found(client: openai.OpenAI) -> None:
    with client.responses.connect() as conn:
        first = _ws_events_valid(_ws_turn(conn, input="Hi.", store=False))
    with client.responses.connect() as conn:
        (error,) = _ws_turn(conn, input="Again.", store=False, previous_response_id=first["id"])
        assert error["type"] == "error" and error["error"]["code"] == "previous_response_not_found"


def test_ws_continuation_of_a_failed_response_is_not_found(client: openai.OpenAI) -> None:
    with client.responses.connect() as conn:
        # a response refused before it ran leaves nothing to continue from
        (refused,) = _ws_turn(conn, input=[{"type": "bogus"}], store=False)
        assert refused["type"] == "error" and refused["status"] == 400
        (error,) = _ws_turn(conn, input="Go on.", previous_response_id="resp_never_made")
        assert error["error"]["code"] == "previous_response_not_found"
        assert _ws_events_valid(_ws_turn(conn, input="Still here?"))["output"]


def test_ws_stored_response_continues_over_http(client: openai.OpenAI) -> None:
    with client.responses.connect() as conn:
        first = _ws_events_valid(_ws_turn(conn, input="Remember: tea."))
    chained = client.responses.create(
        model=MODEL_ID,
        input="What did I say?",
        previous_response_id=first["id"],
    )
    assert chained.previous_response_id == first["id"]


def test_ws_tool_call_events(client: openai.OpenAI) -> None:
    with client.responses.connect() as conn:
        events = _ws_turn(
            conn, input=SF, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False
        )
        final = _ws_events_valid(events)
        assert [o["type"] for o in final["output"]] == ["function_call"]
        assert any(e["type"] == "response.function_call_arguments.delta" for e in events)


def test_ws_generate_false(client: openai.OpenAI) -> None:
    """websocket-generate-false: a `generate: false` create prepares the turn (no output,
    completed); a create continuing it answers."""
    with client.responses.connect() as conn:
        events = _ws_turn(conn, input="My favourite colour is green.", store=False, generate=False)
        assert [e["type"] for e in events] == [
            "response.created",
            "response.in_progress",
            "response.completed",
        ]
        warmed = _ws_events_valid(events)
        assert warmed["status"] == "completed" and warmed["output"] == []
        assert warmed["usage"]["output_tokens"] == 0
        answer = _ws_events_valid(
            _ws_turn(
                conn,
                input="What is my favourite colour?",
                store=False,
                previous_response_id=warmed["id"],
            )
        )
        assert finished(answer) and answer["output"]
        assert answer["previous_response_id"] == warmed["id"]
        assert answer["usage"]["input_tokens"] > warmed["usage"]["input_tokens"]


def test_ws_failed_continuation_evicts_cache(client: openai.OpenAI) -> None:
    """websocket-failed-continuation-evicts-cache: a continuation that fails (an output for
    a call that was never made) evicts what it continued, so continuing it again is
    `previous_response_not_found`."""
    with client.responses.connect() as conn:
        first = _ws_events_valid(
            _ws_turn(
                conn,
                input=SF,
                tools=[WEATHER],
                tool_choice="required",
                parallel_tool_calls=False,
                store=False,
            )
        )
        assert [o["type"] for o in first["output"]] == ["function_call"]
        unknown = {"type": "function_call_output", "call_id": "call_never_made", "output": "{}"}
        (failed,) = _ws_turn(conn, input=[unknown], store=False, previous_response_id=first["id"])
        assert failed["type"] == "error" and failed["status"] == 400
        known = {
            "type": "function_call_output",
            "call_id": first["output"][0]["call_id"],
            "output": '{"temperature": "18C"}',
        }
        (gone,) = _ws_turn(conn, input=[known], store=False, previous_response_id=first["id"])
        assert gone["type"] == "error" and gone["status"] == 404
        assert gone["error"]["code"] == "previous_response_not_found"


def test_ws_compact_new_chain(client: openai.OpenAI, http: httpx.Client) -> None:
    """websocket-compact-new-chain: `/responses/compact`'s output handed back as it came,
    as the input of a new WebSocket chain (no `previous_response_id`), answers completed."""
    said = [
        ("user", "input_text", "Remember the compaction code word: slate."),
        ("assistant", "output_text", "OK."),
        ("user", "input_text", "Compress this conversation for later continuation."),
    ]
    history = [
        {"type": "message", "role": role, "content": [{"type": part, "text": text}]}
        for role, part, text in said
    ]
    r = http.post("/v1/responses/compact", json={"model": MODEL_ID, "input": history})
    assert r.status_code == 200, r.text
    compacted = r.json()
    errors = schema_errors(compacted, "#/components/schemas/CompactResource")
    assert not errors, errors[:5]
    assert compacted["output"][-1]["type"] == "compaction"
    follow = {
        "type": "message",
        "role": "user",
        "content": "Continue from here. Reply with exactly: compacted",
    }
    with client.responses.connect() as conn:
        events = _ws_turn(conn, input=[*compacted["output"], follow], store=False, tools=[])
        final = _ws_events_valid(events)
    assert finished(final) and final["output"]
    assert final["previous_response_id"] is None
