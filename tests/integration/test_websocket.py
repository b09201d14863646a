"""WebSocket mode against the real server, driven by the `openai` SDK's own
`client.responses.connect()`: responses one after another on one socket, a `store: false`
chain continued from the socket's history, errors as events, keys checked at the upgrade."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.sdk_types import strict_response
from tests.support.servers import MODEL_ID, RespdServer, start_server

TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


def _turn(conn: Any, **body: Any) -> list[Any]:
    conn.send({"type": "response.create", "model": MODEL_ID, **body})
    events = []
    for event in conn:
        events.append(event)
        if event.type in TERMINAL:
            return events
    raise AssertionError("the socket closed before a terminal event")


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
