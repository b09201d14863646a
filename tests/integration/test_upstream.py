"""respd in front of another OpenAI-compatible server (`--engine openai`): a second real
`respd serve` with the default model is the upstream, reached through its Chat Completions
route over HTTP on 127.0.0.1. The Responses features run through the front: text, streams,
forced tool calls, structured output, chaining, conversations, background jobs and cancel;
and an upstream killed mid-stream ends the stream with `response.failed` and stores the
response failed."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import openai
import pytest

from tests.support import upstream_flows as flows
from tests.support.sdk_types import strict_event, strict_response
from tests.support.servers import MODEL_ID, RespdServer, start_server
from tests.support.stateful import LONG_PROMPT


def start_pair(tmp: Path) -> tuple[RespdServer, RespdServer]:
    upstream = start_server(tmp, "--ctx-size", "2048", "--store", "memory")
    try:
        front = start_server(
            tmp,
            "--engine", "openai",
            "--upstream-url", upstream.base_url + "/v1",
            "--ctx-size", "2048",
            "--store", "sqlite",
            "--data-dir", str(tmp / "front-data"),
        )  # fmt: skip
    except BaseException:
        upstream.stop()
        raise
    return upstream, front


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RespdServer, RespdServer]]:
    upstream, front = start_pair(tmp_path_factory.mktemp("upstream"))
    yield upstream, front
    front.stop()
    upstream.stop()
    front.assert_no_5xx()
    upstream.assert_no_5xx()


@pytest.fixture()
def client(pair: tuple[RespdServer, RespdServer]) -> openai.OpenAI:
    return pair[1].client()


def raw(client: openai.OpenAI, **kw: object) -> openai.types.responses.Response:
    kw.setdefault("model", MODEL_ID)
    r = client.responses.with_raw_response.create(**kw)  # type: ignore[call-overload]
    return strict_response(json.loads(r.text))


def test_the_front_lists_the_upstream_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL_ID]


def test_text_and_stream(client: openai.OpenAI) -> None:
    resp = raw(client, input="Reply with: hello", temperature=0, max_output_tokens=40)
    assert resp.status in ("completed", "incomplete") and resp.output_text
    assert resp.usage is not None and resp.usage.input_tokens > 0
    assert resp.usage.output_tokens > 0
    events = [
        strict_event(e.to_dict())
        for e in client.responses.create(
            model=MODEL_ID, input="Count to 3.", temperature=0, stream=True, max_output_tokens=40
        )
    ]
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] in (
        "response.completed",
        "response.incomplete",
    )
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text  # type: ignore[union-attr]


def test_forced_tool_call_and_structured_output(client: openai.OpenAI) -> None:
    create = partial(raw, client)
    flows.forced_call(create, {"type": "function", "name": "get_weather"})
    flows.forced_call(create, "required")
    flows.schema_answer(create)


def test_chains_and_conversations_live_in_the_front(client: openai.OpenAI) -> None:
    flows.chain_and_conversation(client, partial(raw, client))


def test_background_and_cancel(client: openai.OpenAI) -> None:
    flows.background_and_cancel(client, partial(raw, client))


def test_embeddings_are_forwarded_to_the_upstream(
    pair: tuple[RespdServer, RespdServer], client: openai.OpenAI
) -> None:
    upstream, front = pair
    texts = ["The cat sat on the mat.", "The cat sat on the mat."]
    r = client.embeddings.create(model=MODEL_ID, input=texts, dimensions=32)
    assert upstream.log().count("POST /v1/embeddings") == 1  # the upstream embedded them
    v = [d.embedding for d in r.data]
    assert [len(x) for x in v] == [32, 32] and r.usage.prompt_tokens > 0
    assert sum(a * b for a, b in zip(v[0], v[1], strict=True)) > 0.9999
    # the upstream's own refusal reaches the client with its status and message
    bad = httpx.post(
        front.base_url + "/v1/embeddings", json={"model": MODEL_ID, "input": [[10**6]]}
    )
    assert bad.status_code == 400 and "vocabulary" in bad.json()["error"]["message"]


def test_an_upstream_killed_mid_stream_fails_the_response(tmp_path: Path) -> None:
    upstream, front = start_pair(tmp_path)
    try:
        client = front.client()
        stream = client.responses.create(
            model=MODEL_ID, input=LONG_PROMPT, stream=True, max_output_tokens=1500
        )
        events = []
        for event in stream:
            events.append(strict_event(event.to_dict()))
            if event.type == "response.output_text.delta" and len(events) > 10:
                upstream.process.send_signal(signal.SIGKILL)
                upstream.process.wait(timeout=30)
                break
        started = time.monotonic()
        events += [strict_event(e.to_dict()) for e in stream]
        assert time.monotonic() - started < 30  # never a hang
        last = events[-1]
        assert last.type == "response.failed", last
        assert last.response.error is not None  # type: ignore[union-attr]
        stored = client.responses.retrieve(last.response.id)  # type: ignore[union-attr]
        assert stored.status == "failed"
        health = front.client().with_options(max_retries=0)
        assert health.models.list().data  # the front still answers
    finally:
        front.stop()
        upstream.stop()


def test_a_local_model_and_an_upstream_side_by_side(
    pair: tuple[RespdServer, RespdServer], tmp_path: Path
) -> None:
    upstream, _ = pair
    both = start_server(
        tmp_path,
        "--ctx-size", "1024",
        "--store", "memory",
        "--upstream", f"remote={upstream.base_url}/v1,model={MODEL_ID},ctx=2048",
    )  # fmt: skip
    try:
        client = both.client()
        assert sorted(m.id for m in client.models.list().data) == sorted([MODEL_ID, "remote"])
        before = upstream.log().count("POST /v1/chat/completions")
        remote = raw(client, model="remote", input="Say hi.", max_output_tokens=8)
        assert remote.model == "remote" and remote.output_text
        assert upstream.log().count("POST /v1/chat/completions") == before + 1
        local = raw(client, input="Say hi.", max_output_tokens=8)
        assert local.model == MODEL_ID
        assert upstream.log().count("POST /v1/chat/completions") == before + 1
        engines = httpx.get(both.base_url + "/health").json()["engines"]
        assert set(engines) == {MODEL_ID, "remote"} and engines["remote"]["healthy"]
    finally:
        both.stop()
    both.assert_no_5xx()


def test_a_client_that_hangs_up_cancels_the_upstream_generation(
    pair: tuple[RespdServer, RespdServer],
) -> None:
    upstream, front = pair
    before = httpx.get(upstream.base_url + "/health").json()["engine"]
    with httpx.Client(base_url=front.base_url, timeout=60) as http:
        body = {"model": MODEL_ID, "input": LONG_PROMPT, "stream": True, "max_output_tokens": 1500}
        with http.stream("POST", "/v1/responses", json=body) as r:
            deltas = 0
            for line in r.iter_lines():
                deltas += "output_text.delta" in line
                if deltas >= 5:
                    break  # hang up mid-stream
    deadline = time.monotonic() + 30
    while True:
        engine = httpx.get(upstream.base_url + "/health").json()["engine"]
        if engine["cancelled"] > before["cancelled"] and engine["running"] == 0:
            break
        assert time.monotonic() < deadline, engine
        time.sleep(0.1)
    # The upstream stopped early: far fewer tokens than the 1500 asked for.
    assert engine["generated_tokens"] - before["generated_tokens"] < 1000
