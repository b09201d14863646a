"""WebSocket mode against the real server, driven by the `openai` SDK's own
`client.responses.connect()`: responses one after another on one socket, a `store: false`
chain continued from the socket's history, errors as events, keys checked at the upgrade."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.sdk_types import strict_response
from tests.support.servers import MODEL_ID, RespdServer, start_server
from tests.support.websocket import TERMINAL, turn


def _turn(conn: Any, **body: Any) -> list[Any]:
    return turn(conn, MODEL_ID, **body)


def test_one_socket_serves_a_store_false_chain(client: openai.OpenAI) -> None:
    with client.responses.connect() as conn:
        first = _turn(
            conn,
            input="My name is Ada. Answer in one short sentence.",
            store=False,
            max_output_tokens=40,
        )
        assert first[0].type == "response.created"
        assert [e.sequence_number for e in first] == list(range(len(first)))
        one = strict_response(first[-1].response.model_dump(mode="json", exclude_unset=True))
        assert one.status in ("completed", "incomplete") and one.output_text
        second = _turn(
            conn,
            input="What is my name?",
            store=False,
            previous_response_id=one.id,
            max_output_tokens=20,
        )
        two = second[-1].response
        assert two.previous_response_id == one.id
        # the second prompt held the first turn: more input than the question alone
        alone = client.responses.input_tokens.count(model=MODEL_ID, input="What is my name?")
        assert two.usage.input_tokens > alone.input_tokens + 10
        (error,) = _turn(conn, input="hi", previous_response_id="resp_missing")
        assert error.type == "error" and error.status == 404
        assert error.error.code == "previous_response_not_found"
        third = _turn(conn, input="Say hi.", max_output_tokens=5)
        assert third[-1].type in ("response.completed", "response.incomplete")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(one.id)  # store: false, never stored


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    srv = start_server(
        tmp_path_factory.mktemp("respd-ws-keys"), "--ctx-size", "1024", "--api-key", "sk-ws"
    )
    yield srv
    srv.stop()
    srv.assert_no_5xx()


def test_the_upgrade_needs_a_key(keyed: RespdServer) -> None:
    bad = openai.OpenAI(base_url=keyed.base_url + "/v1", api_key="sk-wrong")
    with pytest.raises(Exception) as exc, bad.responses.connect() as conn:
        conn.recv()
    assert "403" in str(exc.value)
    good = openai.OpenAI(base_url=keyed.base_url + "/v1", api_key="sk-ws")
    with good.responses.connect() as conn:
        assert _turn(conn, input="Hi", max_output_tokens=4)[-1].type != "error"


# -- lanes, prewarm and the prompt cache, on the real model -------------------------------


def _unique_instructions() -> str:
    """A system prompt no other test shares (so only this test can have cached it), long
    enough that reusing it is unmistakable."""
    tag = uuid.uuid4().hex
    facts = " ".join(f"Fact {i}: the code word {tag[:8]}{i} means {i * 7}." for i in range(20))
    return f"You are a terse assistant ({tag}). {facts}"


def test_lanes_run_side_by_side_each_event_carrying_its_stream_id(client: openai.OpenAI) -> None:
    with client.responses.connect() as conn:
        for lane, text in (("lane-a", "Say apple."), ("lane-b", "Say banana.")):
            conn.send(
                {
                    "type": "response.create",
                    "model": MODEL_ID,
                    "stream_id": lane,
                    "input": text,
                    "store": False,
                    "max_output_tokens": 12,
                }
            )
        events: list[Any] = []
        finals: dict[str, Any] = {}
        for event in conn:
            events.append(event)
            if event.type in TERMINAL:
                assert event.type != "error", event
                finals[event.stream_id] = event.response
                if len(finals) == 2:
                    break
        assert {e.stream_id for e in events} == {"lane-a", "lane-b"}
        for lane in finals:
            seq = [e.sequence_number for e in events if e.stream_id == lane]
            assert seq == list(range(len(seq)))
            strict_response(finals[lane].model_dump(mode="json", exclude_unset=True))
        # a third lane forks lane a's chain
        fork = _turn(
            conn,
            stream_id="fork",
            input="And again?",
            store=False,
            previous_response_id=finals["lane-a"].id,
            max_output_tokens=8,
        )
        assert fork[-1].stream_id == "fork"
        assert fork[-1].response.previous_response_id == finals["lane-a"].id


def test_prewarm_makes_the_next_turn_a_cache_hit(client: openai.OpenAI) -> None:
    instructions = _unique_instructions()
    with client.responses.connect() as conn:
        warm = _turn(conn, instructions=instructions, input="Hello.", store=False, generate=False)
        assert [e.type for e in warm] == [
            "response.created",
            "response.in_progress",
            "response.completed",
        ]
        warmed = strict_response(warm[-1].response.model_dump(mode="json", exclude_unset=True))
        assert warmed.output == [] and warmed.usage is not None
        assert warmed.usage.input_tokens > 200
        nxt = _turn(
            conn,
            instructions=instructions,
            input="What does the first code word mean?",
            store=False,
            previous_response_id=warmed.id,
            max_output_tokens=10,
        )
        usage = nxt[-1].response.usage
        # the whole warmed prompt but for the turn's last tokens (its reply header)
        assert usage.input_tokens_details.cached_tokens >= warmed.usage.input_tokens - 8


def test_a_store_false_continuation_reports_its_cached_prefix(client: openai.OpenAI) -> None:
    instructions = _unique_instructions()
    with client.responses.connect() as conn:
        first = _turn(
            conn, instructions=instructions, input="Hi.", store=False, max_output_tokens=8
        )[-1].response
        second = _turn(
            conn,
            instructions=instructions,
            input="Bye.",
            store=False,
            previous_response_id=first.id,
            max_output_tokens=8,
        )[-1].response
        assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 8


def test_prompt_cache_key_reuse_and_retention(client: openai.OpenAI) -> None:
    instructions = _unique_instructions()
    key = f"conv-{uuid.uuid4().hex}"
    one = client.responses.create(
        model=MODEL_ID,
        instructions=instructions,
        input="Say one.",
        prompt_cache_key=key,
        prompt_cache_retention="24h",
        max_output_tokens=6,
    )
    assert one.prompt_cache_key == key and one.prompt_cache_retention == "24h"
    two = client.responses.create(
        model=MODEL_ID,
        instructions=instructions,
        input="Say two.",
        prompt_cache_key=key,
        prompt_cache_retention="in_memory",
        max_output_tokens=6,
    )
    assert two.prompt_cache_retention == "in_memory"
    assert two.usage is not None and one.usage is not None
    # the shared system prompt came from the cache the key last filled
    assert two.usage.input_tokens_details.cached_tokens >= one.usage.input_tokens - 12
    chat = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "system", "content": instructions}, {"role": "user", "content": "3?"}],
        max_tokens=4,
        extra_body={"prompt_cache_key": key, "prompt_cache_retention": "24h"},
    )
    assert chat.usage is not None and chat.usage.prompt_tokens_details is not None
    assert chat.usage.prompt_tokens_details.cached_tokens >= one.usage.input_tokens - 12
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(
            model=MODEL_ID, input="x", extra_body={"prompt_cache_retention": "forever"}
        )
    assert bad.value.body["param"] == "prompt_cache_retention"  # type: ignore[index]


def test_http_only_fields_are_refused_naming_the_field(client: openai.OpenAI) -> None:
    with client.responses.connect() as conn:
        for field, value in (
            ("stream", False),
            ("stream_options", {"include_obfuscation": False}),
            ("background", True),
        ):
            (error,) = _turn(conn, input="hi", stream_id="s", **{field: value})
            assert error.type == "error" and error.status == 400
            assert error.error.param == field and error.stream_id == "s"
        assert _turn(conn, input="Hi", stream=True, max_output_tokens=4)[-1].type != "error"


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    srv = start_server(
        tmp_path_factory.mktemp("respd-ws-limits"),
        "--ws-max-active-responses",
        "2",
        "--ws-max-streams",
        "1",
        "--ws-max-connection-secs",
        "10",  # the two answers below take a second or two; then the test waits it out
        preset="compact",
    )
    yield srv
    srv.stop()
    srv.assert_no_5xx()


def test_connection_limits_and_their_errors(limited: RespdServer) -> None:
    client = limited.client()
    with client.responses.connect() as conn:
        opened = time.monotonic()
        body: dict[str, Any] = {
            "type": "response.create",
            "model": MODEL_ID,
            "max_output_tokens": 24,
        }
        conn.send({**body, "input": "Count slowly.", "stream_id": "a"})
        conn.send({**body, "input": "Other lane.", "stream_id": "b"})  # one busy lane at most
        conn.send({**body, "input": "Queued behind.", "stream_id": "a"})
        conn.send({**body, "input": "Too many.", "stream_id": "a"})  # two in flight at most
        errors, finals = [], []
        for event in conn:
            if event.type == "error":
                errors.append(event)
            elif event.type in TERMINAL:
                finals.append(event)
            if len(finals) == 2 and len(errors) == 2:
                break
        assert sorted(str(e.error.code) for e in errors) == [
            "websocket_active_response_limit_reached",
            "websocket_stream_limit_reached",
        ]
        assert all(e.status == 429 for e in errors)
        assert {f.stream_id for f in finals} == {"a"}
        # at its age limit the connection says so, and closes
        last = None
        for event in conn:  # ends when the server closes the connection
            last = event
        assert last is not None and last.type == "error"
        assert last.error.code == "websocket_connection_limit_reached"
        assert time.monotonic() - opened >= 9
