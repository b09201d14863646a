"""No runaway turns, against the real embedded model through the `openai` SDK: the DRY
request fields and flags, the repetition stop (a greedy turn that may not end loops, and is
cut, logged and counted), the default output cap (listed in /v1/models, bounding a turn
that sets none), and structured output that closes its strings (at its limit, or where it
loops)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from respd.config import embedded_model_path
from respd.engines.llamacpp import LlamaCppEngine
from tests.support.sdk_types import strict_response
from tests.support.servers import MODEL_ID, RespdServer, start_server

# One thread per server: these servers decode while other test servers share the cores,
# and llama.cpp's threads spin-wait for each other on a busy machine.
ONE_THREAD = ("--threads", "1")


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    """A server on its defaults: DRY on for the embedded model, the repetition stop, the
    default cap (a quarter of its 2048-token window)."""
    srv = start_server(tmp_path_factory.mktemp("guarded"), *ONE_THREAD, preset="small")
    yield srv
    srv.stop()
    srv.assert_no_5xx()


@pytest.fixture()
def client(guarded: RespdServer) -> openai.OpenAI:
    return guarded.client(timeout=600)


@pytest.fixture()
def http(guarded: RespdServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=guarded.base_url, timeout=120) as c:
        yield c


DRY = {
    "dry_multiplier": 0.8,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": -1,
    "dry_sequence_breakers": ["\n", ":", '"', "*"],
}


def test_dry_request_fields_on_both_apis(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model=MODEL_ID, input="List three colors.", max_output_tokens=60, extra_body=DRY
    )
    strict_response(r.to_dict())
    assert r.status in ("completed", "incomplete") and r.output_text
    chat = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "List three colors."}],
        max_tokens=60,
        extra_body=DRY,
    )
    assert chat.choices[0].message.content


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions"])
def test_a_bad_dry_value_is_a_400_naming_it(http: httpx.Client, path: str) -> None:
    body: dict[str, object] = {"model": MODEL_ID, "dry_base": 0.5}
    if path == "/v1/responses":
        body["input"] = "hi"
    else:
        body["messages"] = [{"role": "user", "content": "hi"}]
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "dry_base"


def test_the_default_cap_is_listed_and_bounds_a_turn(
    client: openai.OpenAI, http: httpx.Client
) -> None:
    card = http.get(f"/v1/models/{MODEL_ID}").json()
    assert card["max_output_tokens"] == card["context_window"] // 4
    r = client.responses.create(model=MODEL_ID, input="Count from 1 to 3.")
    assert r.usage is not None and r.usage.output_tokens <= card["max_output_tokens"]
    assert r.status == "completed" or r.incomplete_details is not None


@pytest.fixture(scope="module")
def dry_off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    """Without DRY, and with flags that set every DRY setting (the server must take them)."""
    srv = start_server(
        tmp_path_factory.mktemp("dry-off"),
        "--dry-multiplier",
        "0",
        "--dry-base",
        "2",
        "--dry-allowed-length",
        "3",
        "--dry-penalty-last-n",
        "512",
        "--dry-sequence-breakers",
        '["\\n", ";"]',
        *ONE_THREAD,
        preset="compact",
    )
    yield srv
    srv.stop()
    srv.assert_no_5xx()


def repetition_stops(server: RespdServer, api: str) -> float:
    text = httpx.get(server.base_url + "/metrics").text
    line = f'respd_repetition_stops_total{{api="{api}"}} '
    return next(float(x.split()[-1]) for x in text.splitlines() if x.startswith(line))


def test_a_loop_is_cut_logged_and_counted(dry_off: RespdServer) -> None:
    client = dry_off.client(timeout=300)
    # Greedy, and its end of turn blocked: the 135M model repeats itself.
    loop = {"ignore_eos": True, "temperature": 0}
    r = client.responses.create(
        model=MODEL_ID, input="Say hello.", max_output_tokens=900, extra_body=loop
    )
    strict_response(r.to_dict())
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage is not None and r.usage.output_tokens < 900
    chat = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=900,
        extra_body=loop,
    )
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None and chat.usage.completion_tokens < 900
    assert repetition_stops(dry_off, "responses") == 1
    assert repetition_stops(dry_off, "chat") == 1
    assert "generation stopped: repetition" in dry_off.log()


def test_the_repetition_stop_can_be_switched_off(tmp_path: Path) -> None:
    srv = start_server(
        tmp_path, "--repetition-stop", "0", "--dry-multiplier", "0", *ONE_THREAD, preset="compact"
    )
    try:
        r = srv.client(timeout=300).responses.create(
            model=MODEL_ID,
            input="Say hello.",
            max_output_tokens=300,
            extra_body={"ignore_eos": True, "temperature": 0},
        )
        assert r.usage is not None and r.usage.output_tokens == 300
        assert repetition_stops(srv, "responses") == 0
    finally:
        srv.stop()


def test_a_looping_structured_answer_is_closed_where_the_loop_is_cut(dry_off: RespdServer) -> None:
    engine = LlamaCppEngine(
        embedded_model_path(), model_id=MODEL_ID, n_ctx=256, parallel=1, n_threads=1
    )
    try:
        [word] = engine.tokenize("mail")
    finally:
        engine.close()
    schema = {
        "type": "object",
        "properties": {"email": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["email", "age"],
        "additionalProperties": False,
    }
    before = repetition_stops(dry_off, "chat")
    chat = dry_off.client(timeout=300).chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Invent a profile as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
        logit_bias={str(word): 100},  # inside the string, "mail" again and again
        max_tokens=400,
        temperature=0,
    )
    text = chat.choices[0].message.content or ""
    value = json.loads(text)  # closed where the loop was cut, so it parses
    assert value["email"].startswith("mailmailmail") and isinstance(value["age"], int)
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None and chat.usage.completion_tokens < 100
    assert repetition_stops(dry_off, "chat") == before + 1


# -- structured output closes its strings ---------------------------------------------------


class Dim(BaseModel):
    width: int = Field(ge=1, le=10)
    unit: Literal["cm", "in"]


class Box(BaseModel):
    label: str | None
    dims: Dim
    count: int = Field(ge=0, le=5)


def test_structured_output_parses_in_four_of_five_runs(client: openai.OpenAI) -> None:
    parsed = 0
    texts = []
    for _ in range(5):
        try:
            r = client.responses.parse(
                model=MODEL_ID,
                input="Describe a small box.",
                text_format=Box,
                max_output_tokens=400,
            )
        except ValueError as exc:  # the JSON was cut off: pydantic's ValidationError
            texts.append(str(exc)[:200])
            continue
        texts.append(r.output_text)
        parsed += isinstance(r.output_parsed, Box)
    assert parsed >= 4, texts
