"""The benchmark extensions `ignore_eos` and `min_tokens` on both APIs, on the fake engine:
accepted at the top level of the body (where the SDK's `extra_body` puts them) and handed
to the engine in `SamplingParams`; bad values are 400s in OpenAI's shape naming the field."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from respd.engines.fake import FakeEngine
from tests.support.fake import FAKE_MODEL

CHAT = (
    "/v1/chat/completions",
    {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]},
)
RESPONSES = ("/v1/responses", {"model": FAKE_MODEL, "input": "hi"})


async def test_both_apis_hand_the_fields_to_the_engine(
    engine: FakeEngine, sdk: openai.AsyncOpenAI
) -> None:
    engine.add("Hi.", "Hi.", "Hi.")
    await sdk.chat.completions.create(
        model=FAKE_MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=40,
        extra_body={"ignore_eos": True, "min_tokens": 40},
    )
    await sdk.responses.create(
        model=FAKE_MODEL,
        input="hi",
        max_output_tokens=50,
        extra_body={"ignore_eos": True, "min_tokens": 30},
    )
    await sdk.responses.create(model=FAKE_MODEL, input="hi")
    chat, responses, plain = (c.params for c in engine.calls)
    assert (chat.ignore_eos, chat.min_tokens, chat.max_tokens) == (True, 40, 40)
    assert (responses.ignore_eos, responses.min_tokens) == (True, 30)
    assert (plain.ignore_eos, plain.min_tokens) == (False, 0)


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"ignore_eos": "sometimes"}, "ignore_eos", "invalid_value"),
        ({"ignore_eos": [True]}, "ignore_eos", "invalid_type"),
        ({"min_tokens": "many"}, "min_tokens", "invalid_value"),
        ({"min_tokens": 2.5}, "min_tokens", "invalid_value"),
        ({"min_tokens": -1}, "min_tokens", "integer_below_min_value"),
    ],
)
@pytest.mark.parametrize("route", [CHAT, RESPONSES], ids=["chat", "responses"])
async def test_bad_values_are_400s_naming_the_field(
    http: httpx.AsyncClient,
    engine: FakeEngine,
    route: tuple[str, dict[str, Any]],
    extra: dict[str, Any],
    param: str,
    code: str,
) -> None:
    path, body = route
    r = await http.post(path, json=body | extra)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert not engine.calls


@pytest.mark.parametrize(
    ("path", "body", "limit"),
    [
        (CHAT[0], CHAT[1] | {"max_tokens": 10}, "max_tokens"),
        (
            CHAT[0],
            CHAT[1] | {"max_tokens": 99, "max_completion_tokens": 10},
            "max_completion_tokens",
        ),
        (RESPONSES[0], RESPONSES[1] | {"max_output_tokens": 16}, "max_output_tokens"),
    ],
)
async def test_min_tokens_above_the_token_limit_is_refused(
    http: httpx.AsyncClient, engine: FakeEngine, path: str, body: dict[str, Any], limit: str
) -> None:
    r = await http.post(path, json=body | {"min_tokens": 20})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == ("min_tokens", "invalid_value")
    assert f"'{limit}'" in error["message"]
    # Equal to the limit is the benchmark case (exactly that many tokens) and is accepted.
    engine.add("Hi.")
    ok = await http.post(path, json=body | {"min_tokens": 10})
    assert ok.status_code == 200, ok.text
    assert engine.calls[-1].params.min_tokens == 10
