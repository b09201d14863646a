"""A hosted gateway's Responses API examples, run as its documentation prints them, against
respd routing `openai/gpt-6.1-sol` to a provider: a second respd serving the embedded model.

Only the base URL and the key differ from the documentation: the curl command runs the real
`curl`, the Python examples the `openai` SDK, and the TypeScript one (no type annotations in
it, so plain JavaScript) the `openai` npm package on the Node.js of tests/clients/node."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.support.sdk_types import strict_response
from tests.support.servers import MODEL_ID, RespdServer, start_server

MODEL = "openai/gpt-6.1-sol"
NODE_DIR = Path(__file__).parents[1] / "clients" / "node"
# A cap for requests that set none. The documentation's own 1024 passes through unchanged,
# so the answers are greedy: the same length in every run (about 330 tokens for the gateway
# question). Sampled at 0.2 they ran from 250 tokens to the whole 1024 (35 s on two cores),
# and the module's time swung by a minute.
CAP = ("--max-output-tokens", "48", "--temperature", "0")

# responses.ts from the documentation, its base URL and key read from the environment.
RESPONSES_MJS = """\
import OpenAI from 'openai'

const client = new OpenAI({
  baseURL: process.env.GATEWAY_BASE_URL,
  apiKey: process.env.GATEWAY_API_KEY
})

const response = await client.responses.create({
  model: 'openai/gpt-6.1-sol',
  input: 'Explain what an API Gateway is',
  instructions: 'You are a helpful technical assistant. Respond in English.',
  max_output_tokens: 1024
})

console.log(response.output_text)
"""


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    tmp = tmp_path_factory.mktemp("gateway")
    backend = start_server(tmp, *CAP, preset="small")
    try:
        upstream = (
            f"sol=http://127.0.0.1:{backend.port}/v1,model={MODEL_ID},"
            f"provider=backend,model_id={MODEL}"
        )
        server = start_server(tmp, "--engine", "openai", "--upstream", upstream, *CAP)
        yield server
        server.stop()
        server.assert_no_5xx()
    finally:
        backend.stop()
    backend.assert_no_5xx()


@pytest.fixture()
def client(front: RespdServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=front.base_url + "/v1", api_key="<your OFOXAI_API_KEY>")


def checked(response: openai.types.responses.Response) -> openai.types.responses.Response:
    """The SDK's object, re-validated strictly from its wire form, and served as `MODEL`."""
    strict_response(response.to_dict())
    assert response.model == MODEL
    assert response.status in ("completed", "incomplete")
    return response


def test_curl_example(front: RespdServer) -> None:
    body = """{
    "model": "openai/gpt-6.1-sol",
    "input": "Explain what an API Gateway is",
    "instructions": "You are a helpful technical assistant. Respond in English.",
    "max_output_tokens": 1024
  }"""
    done = subprocess.run(
        [
            "curl", "-sS", "-i", f"{front.base_url}/v1/responses",
            "-H", "Authorization: Bearer sk-test",
            "-H", "Content-Type: application/json",
            "-d", body,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )  # fmt: skip
    head, _, payload = done.stdout.partition("\n\n")  # text=True made each CRLF a newline
    status, *lines = head.splitlines()
    assert status.split()[1] == "200", done.stdout[-2000:]
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    assert headers["x-respd-provider"] == "backend"
    resp = strict_response(json.loads(payload))
    assert resp.model == MODEL and resp.output_text.strip()


def test_python_examples(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="openai/gpt-6.1-sol",
        input="Explain what an API Gateway is",
        instructions="You are a helpful technical assistant. Respond in English.",
        max_output_tokens=1024,
    )
    assert checked(response).output_text.strip()

    response = client.responses.create(
        model="openai/gpt-6.1-sol",
        input=[
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "What is the capital of France?"}],
            },
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_abc123",
                "status": "completed",
                "content": [
                    {
                        "type": "output_text",
                        "text": "The capital of France is Paris.",
                        "annotations": [],
                    }
                ],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "How many people live there?"}],
            },
        ],
    )
    assert checked(response).output_text.strip()


def test_streaming_example(client: openai.OpenAI, capsys: pytest.CaptureFixture[str]) -> None:
    stream = client.responses.create(
        model="openai/gpt-6.1-sol", input="Tell me a joke about programming", stream=True
    )
    last = None
    for event in stream:
        if event.type == "response.output_text.delta":
            print(event.delta, end="", flush=True)
        last = event
    printed = capsys.readouterr().out
    assert printed.strip()
    assert last is not None and last.type in ("response.completed", "response.incomplete")
    assert checked(last.response).output_text == printed


def test_function_calling_and_tool_results(client: openai.OpenAI) -> None:
    # The document's tool leaves out `strict`, which the SDK's types (not its API) require.
    response = client.responses.create(  # type: ignore[call-overload]
        model="openai/gpt-6.1-sol",
        input="What's the weather like in Beijing today?",
        tools=[
            {
                "type": "function",
                "name": "get_weather",
                "description": "Get the current weather for the specified city",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "location": {"type": "string", "description": "City name, e.g. Beijing"},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    },
                    "required": ["location"],
                },
            }
        ],
        tool_choice="auto",
    )
    checked(response)
    for item in response.output:  # the model may answer in text: "auto" lets it
        if item.type == "function_call":
            assert item.name == "get_weather"
            json.loads(item.arguments)

    response = client.responses.create(
        model="openai/gpt-6.1-sol",
        input=[
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What's the weather like in Beijing today?"}
                ],
            },
            {
                "type": "function_call",
                "id": "fc_abc123",
                "call_id": "call_xyz789",
                "name": "get_weather",
                "arguments": '{"location":"Beijing","unit":"celsius"}',
            },
            {
                "type": "function_call_output",
                "id": "fco_abc123",
                "call_id": "call_xyz789",
                "output": '{"temperature":"22°C","condition":"sunny"}',
            },
        ],
    )
    assert checked(response).output_text.strip()


def test_bare_model_name(front: RespdServer) -> None:
    with front.client() as c:
        raw = c.responses.with_raw_response.create(
            model="gpt-6.1-sol", input="Say hello.", max_output_tokens=16
        )
    assert raw.headers["x-respd-provider"] == "backend"
    assert raw.parse().model == MODEL


def node_binary() -> Path:
    """The lockfile's Node.js, else the machine's, provided the `openai` package is there."""
    bundled = NODE_DIR / "node_modules" / ".bin" / "node"
    found = bundled if bundled.exists() else shutil.which("node")
    if found and (NODE_DIR / "node_modules" / "openai").is_dir():
        return Path(found)
    hint = "npm ci --no-audit --no-fund --prefix tests/clients/node"
    if os.environ.get("CI"):
        pytest.fail(f"Node.js or the openai npm package is missing: {hint}")
    pytest.skip(f"needs Node.js and the openai npm package: {hint}")


def test_typescript_example(front: RespdServer, tmp_path: Path) -> None:
    node = node_binary()
    # Node resolves a module's bare imports from node_modules beside it or above it.
    (tmp_path / "node_modules").symlink_to(NODE_DIR / "node_modules")
    script = tmp_path / "responses.mjs"
    script.write_text(RESPONSES_MJS)
    done = subprocess.run(
        [str(node), str(script)],
        cwd=tmp_path,
        env={
            **os.environ,
            "GATEWAY_BASE_URL": front.base_url + "/v1",
            "GATEWAY_API_KEY": "<your OFOXAI_API_KEY>",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip()
