"""Chat's `logit_bias` on the fake engine: the biases reach the engine as integer token
ids; an id outside the model's vocabulary is a 400 naming the field (llama.cpp would index
its logits with it unchecked), and nothing is generated."""

from __future__ import annotations

import openai
import pytest

from respd.engines.fake import FakeEngine
from tests.support.fake import FAKE_MODEL

MESSAGES = [{"role": "user", "content": "hi"}]


async def test_the_biases_reach_the_engine(engine: FakeEngine, sdk: openai.AsyncOpenAI) -> None:
    engine.n_vocab = 1000
    engine.add("Hi.", "Hi.")
    await sdk.chat.completions.create(
        model=FAKE_MODEL, messages=MESSAGES, logit_bias={"17": -100, "999": 5.5}
    )
    await sdk.chat.completions.create(model=FAKE_MODEL, messages=MESSAGES)
    biased, plain = (c.params for c in engine.calls)
    assert biased.logit_bias == {17: -100.0, 999: 5.5}
    assert plain.logit_bias == {}


@pytest.mark.parametrize("token", ["1000", "4294967295"])
async def test_a_token_outside_the_vocabulary_is_400(
    engine: FakeEngine, sdk: openai.AsyncOpenAI, token: str
) -> None:
    engine.n_vocab = 1000
    with pytest.raises(openai.BadRequestError) as info:
        await sdk.chat.completions.create(
            model=FAKE_MODEL, messages=MESSAGES, logit_bias={"3": 1, token: 1}
        )
    error = info.value.body
    assert isinstance(error, dict)
    assert (error["param"], error["code"]) == ("logit_bias", "invalid_value")
    assert token in error["message"] and "0 to 999" in error["message"]
    assert engine.calls == []


async def test_an_engine_without_a_known_vocabulary_passes_them_on(
    engine: FakeEngine, sdk: openai.AsyncOpenAI
) -> None:
    engine.n_vocab = None  # a remote server checks the ids itself
    engine.add("Hi.")
    await sdk.chat.completions.create(model=FAKE_MODEL, messages=MESSAGES, logit_bias={"123456": 1})
    assert engine.calls[0].params.logit_bias == {123456: 1.0}
