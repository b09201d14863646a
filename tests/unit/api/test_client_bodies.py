"""The request bodies real clients sent (captured by the client suite, tests/clients/fixtures)
replayed against the app over the fake engine: every one is accepted, and every answer —
JSON or event stream — validates with the `openai` SDK's own types.

A flow's requests replay in order; ids the original answers created (responses,
conversations, files) are swapped for the ids the replay creates, so `previous_response_id`
and conversation continuations point at real objects."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from openai.types.chat import ChatCompletion
from openai.types.conversations import Conversation
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from respd.api.app import create_app
from respd.engines.base import Prompt, SamplingParams
from respd.engines.fake import FakeEngine, Reply
from respd.service.sealing import Sealer
from respd.store import MemoryStore
from tests.clients.capture import FIXTURE_STATE_KEY

# The model id the clients asked for (the default model's).
CLIENT_MODEL = "smollm2-135m-instruct"
FIXTURES = Path(__file__).parents[2] / "clients" / "fixtures"
CASES = sorted(FIXTURES.glob("*/*.json"))
CALL_ID = re.compile(r'"call_id"\s*:\s*"([^"]+)"')
EVENTS: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)


class Script:
    """What the fake model says next: as many calls as the original answer held (so the
    client's tool outputs have calls to answer), else a call when calls are forced, else a
    short JSON answer (plain text too, for requests without a format)."""

    calls = 0

    def respond(self, prompt: Prompt, params: SamplingParams) -> Reply:
        constraint = prompt.request.constraint
        tools = list(prompt.request.tools)
        if constraint is not None and constraint.calls is not None:
            tools = list(constraint.calls.tools) or tools
        forced = constraint is not None and constraint.forced_calls
        count = self.calls or (1 if forced else 0)
        if count and tools:
            # distinct arguments: identical repeated calls are folded into one
            name = tools[0].name
            calls = [
                f'<tool_call>\n{{"name": "{name}", "arguments": {{"n": {n}}}}}\n</tool_call>'
                for n in range(count)
            ]
            return Reply(["\n".join(calls)])
        return Reply(["{", "}"])


@pytest.fixture()
def script() -> Script:
    return Script()


@pytest.fixture()
def engine(script: Script) -> FakeEngine:
    # Codex's prompts are long, and the fake tokenizer counts every character.
    return FakeEngine(respond=script.respond, model_id=CLIENT_MODEL, context_window=1 << 20)


@pytest.fixture()
def app(engine: FakeEngine) -> FastAPI:
    # the recording server's key: the sealed items clients hand back open here too
    return create_app(engine, MemoryStore(), sealer=Sealer.from_secret(FIXTURE_STATE_KEY))


def test_every_client_left_fixtures() -> None:
    clients = {path.parent.name for path in CASES}
    assert clients >= {
        "openai-python",
        "agents-python",
        "langchain",
        "pydantic-ai",
        "litellm",
        "openai-node",
        "vercel-ai",
        "agents-js",
    }


def _swap(value: Any, ids: dict[str, str]) -> Any:
    text = json.dumps(value)
    for old, new in ids.items():
        text = text.replace(old, new)
    return json.loads(text)


def _created(path: str, answer: httpx.Response) -> str | None:
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        for line in answer.text.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                return json.loads(line[6:]).get("response", {}).get("id")
        return None
    body = answer.json()
    return body.get("id") if isinstance(body, dict) else None


def _validate(path: str, answer: httpx.Response) -> None:
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
        if path.startswith("/v1/responses"):
            events = [EVENTS.validate_json(d) for d in data]
            assert events[0].type == "response.created"
            assert events[-1].type in ("response.completed", "response.incomplete")
        else:
            assert data[-1] == "[DONE]"
        return
    body = answer.json()
    if path == "/v1/responses":
        Response.model_validate(body)
    elif path == "/v1/chat/completions":
        ChatCompletion.model_validate(body)
    elif path == "/v1/conversations":
        Conversation.model_validate(body)


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
async def test_client_requests_replay(case: Path, http: httpx.AsyncClient, script: Script) -> None:
    ids: dict[str, str] = {}
    for request in json.loads(case.read_text()):
        path = _swap(request["path"], ids)
        script.calls = len(request.get("calls") or [])
        if request["body"] is None:  # a multipart file upload
            files = {"file": ("replayed.txt", b"Replayed file contents.\n", "text/plain")}
            answer = await http.post(path, files=files, data={"purpose": "user_data"})
        else:
            answer = await http.post(path, json=_swap(request["body"], ids))
        assert answer.status_code == 200, (path, request["body"], answer.text)
        _validate(path, answer)
        if request.get("created") and (new := _created(path, answer)):
            ids[request["created"]] = new
        replayed_calls = list(dict.fromkeys(CALL_ID.findall(answer.text)))
        ids.update(zip(request.get("calls") or [], replayed_calls, strict=False))
