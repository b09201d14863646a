"""respd in front of llama.cpp's own llama-server (`--engine openai`), built from the same
vendored llama.cpp sources (scripts/llama-server.sh) and serving the default model: text,
streams, forced tool calls (asked for as a JSON-Schema answer, since llama-server cannot
force a call for this model's template), a JSON-Schema answer, chaining, conversations,
background jobs and cancel, all through respd's Responses API.

The binary comes from RESPD_TEST_LLAMA_SERVER; without it these tests fail under CI (`.ci/run`
builds it) and skip elsewhere, saying how to build it."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import openai
import pytest

from respd.config import embedded_model_path
from respd.engines.llamacpp import cpu_advertises_amx
from tests.support import upstream_flows as flows
from tests.support.sdk_types import strict_event, strict_response
from tests.support.servers import RespdServer, free_port, start_server

ENV = "RESPD_TEST_LLAMA_SERVER"
MODEL = "smol"


def llama_server_binary() -> Path:
    path = os.environ.get(ENV)
    if path:
        return Path(path)
    if os.environ.get("CI"):
        pytest.fail(f"{ENV} is not set: .ci/run builds llama-server with scripts/llama-server.sh")
    pytest.skip(f'these tests need {ENV}: export {ENV}="$(scripts/llama-server.sh)"')


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    binary = llama_server_binary()
    tmp = tmp_path_factory.mktemp("llama-server")
    port = free_port()
    log = (tmp / "llama-server.log").open("wb")
    llama = subprocess.Popen(
        [
            str(binary),
            "-m",
            str(embedded_model_path()),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-c",
            "4096",
            "-np",
            "2",
            "-t",
            "2",
            "--alias",
            MODEL,
            "--jinja",
            "--no-webui",
            # ggml's AMX kernels crash under some hypervisors; respd's engine decides alike.
            "--no-repack" if cpu_advertises_amx() else "--repack",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert llama.poll() is None, (tmp / "llama-server.log").read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "llama-server did not start"
            time.sleep(0.2)
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
    finally:
        llama.terminate()
        llama.wait(timeout=30)


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
