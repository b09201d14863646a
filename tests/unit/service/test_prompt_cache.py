"""`prompt_cache_key` and `prompt_cache_retention` on both APIs, over the app and the fake
engine: checked, echoed as OpenAI spells them, and handed to the engine."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from respd.api.app import create_app
from respd.engines.fake import FakeEngine, Reply
from respd.service.generation.prompt_cache import MAX_KEY_CHARS
from respd.store import MemoryStore
from tests.support.fake import FAKE_MODEL
from tests.support.sdk_types import strict_response


def _client(engine: FakeEngine) -> TestClient:
    return TestClient(create_app(engine, MemoryStore()))


@pytest.mark.parametrize(
    ("given", "echoed", "retain"),
    [
        (None, None, False),
        ("in_memory", "in_memory", False),
        ("in-memory", "in_memory", False),
        ("24h", "24h", True),
    ],
)
def test_responses_echo_the_retention_and_hand_it_to_the_engine(
    given: str | None, echoed: str | None, retain: bool
) -> None:
    engine = FakeEngine([Reply(["ok"], cached_tokens=3)], model_id=FAKE_MODEL)
    with _client(engine) as client:
        body = {"model": FAKE_MODEL, "input": "hi", "prompt_cache_key": "conv-1"}
        if given is not None:
            body["prompt_cache_retention"] = given
        r = client.post("/v1/responses", json=body)
        assert r.status_code == 200, r.text
        done = strict_response(r.json())
        assert done.prompt_cache_key == "conv-1"
        assert done.prompt_cache_retention == echoed
        assert done.usage is not None and done.usage.input_tokens_details.cached_tokens == 3
    (call,) = engine.calls
    assert call.cache_key == "conv-1" and call.retain is retain


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("prompt_cache_retention", "forever", "invalid_value"),
        ("prompt_cache_retention", "1h", "invalid_value"),
        ("prompt_cache_key", "k" * (MAX_KEY_CHARS + 1), "string_above_max_length"),
    ],
)
def test_bad_prompt_cache_fields_are_400s_on_both_apis(field: str, value: str, code: str) -> None:
    engine = FakeEngine([], model_id=FAKE_MODEL)
    with _client(engine) as client:
        r = client.post("/v1/responses", json={"model": FAKE_MODEL, "input": "hi", field: value})
        assert r.status_code == 400
        assert r.json()["error"]["param"] == field and r.json()["error"]["code"] == code
        r = client.post(
            "/v1/chat/completions",
            json={
                "model": FAKE_MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                field: value,
            },
        )
        assert r.status_code == 400
        assert r.json()["error"]["param"] == field and r.json()["error"]["code"] == code
    assert engine.calls == []


def test_chat_takes_the_fields_and_reports_cached_tokens() -> None:
    engine = FakeEngine([Reply(["ok"], cached_tokens=5)], model_id=FAKE_MODEL)
    with _client(engine) as client:
        r = client.post(
            "/v1/chat/completions",
            json={
                "model": FAKE_MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "prompt_cache_key": "k",
                "prompt_cache_retention": "24h",
            },
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 5
    (call,) = engine.calls
    assert call.cache_key == "k" and call.retain


def test_a_chain_without_a_key_is_keyed_by_its_first_response() -> None:
    engine = FakeEngine([Reply(["ok"]) for _ in range(6)], model_id=FAKE_MODEL)
    with _client(engine) as client:

        def turn(**fields: object) -> str:
            r = client.post("/v1/responses", json={"model": FAKE_MODEL, "input": "hi", **fields})
            assert r.status_code == 200, r.text
            return str(r.json()["id"])

        first = turn()
        second = turn(previous_response_id=first)
        turn(previous_response_id=second)
        # The client's own key, then `user`, still come first.
        turn(previous_response_id=second, prompt_cache_key="mine")
        turn(previous_response_id=second, user="ada")
        conv = client.post("/v1/conversations", json={}).json()["id"]
        turn(conversation=conv)
    keys = [call.cache_key for call in engine.calls]
    assert keys == [None, first, first, "mine", "ada", conv]
