"""respd in front of llama.cpp's own llama-server (`--engine openai`), built from the same
vendored llama.cpp sources (scripts/llama-server.sh) and serving the default model: text,
streams, forced tool calls (asked for as a JSON-Schema answer, since llama-server cannot
force a call for this model's template), a JSON-Schema answer, chaining, conversations,
background jobs and cancel, all through respd's Responses API.

The binary comes from RESPD_TEST_LLAMA_SERVER; without it these tests fail under CI (`.ci/run`
builds it) and skip elsewhere, saying how to build it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial

import openai
import pytest

from tests.support import upstream_flows as flows
from tests.support.llama_server import llama_server
from tests.support.sdk_types import strict_event, strict_response
from tests.support.servers import RespdServer, start_server

MODEL = "smol"


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    tmp = tmp_path_factory.mktemp("llama-server")
    with llama_server(tmp, MODEL) as port:
        # llama-server drops the tools of a template that has none (SmolLM2's), so it cannot
        # force a call: respd is told, and asks for forced calls as a schema answer.
        server = start_server(
            tmp,
            "--engine", "openai",
            "--upstream", f"{MODEL}=http://127.0.0.1:{port}/v1,tool_choice=false",
            "--ctx-size", "2048",
            "--store", "memory",
        )  # fmt: skip
        yield server
        server.stop()
        server.assert_no_5xx()


@pytest.fixture()
def client(front: RespdServer) -> openai.OpenAI:
    return front.client()


def make(client: openai.OpenAI, **kw: object) -> openai.types.responses.Response:
    r = client.responses.with_raw_response.create(model=MODEL, **kw)  # type: ignore[call-overload]
    return strict_response(json.loads(r.text))


def test_text_and_stream(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    resp = make(client, input="Reply with: hello", temperature=0, max_output_tokens=40)
    assert resp.status in ("completed", "incomplete") and resp.output_text
    assert resp.usage is not None and resp.usage.input_tokens > 0
    events = [
        strict_event(e.to_dict())
        for e in client.responses.create(
            model=MODEL, input="Count to 3.", temperature=0, stream=True, max_output_tokens=40
        )
    ]
    assert events[-1].type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and text == events[-1].response.output_text  # type: ignore[union-attr]


def test_forced_tool_call_and_schema_answer(client: openai.OpenAI) -> None:
    create = partial(make, client)
    flows.forced_call(create, "required")
    flows.forced_call(create, {"type": "function", "name": "get_weather"})
    flows.schema_answer(create)


def test_state_lives_in_respd(client: openai.OpenAI) -> None:
    flows.chain_and_conversation(client, partial(make, client))
    flows.background_and_cancel(client, partial(make, client))
