"""Chat's `logit_bias` with the real model through the SDK: a -100 bias keeps the greedy
first token out of the answer, a +100 bias makes its token the whole answer, and an id
past the vocabulary is a 400 naming the field."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from respd.config import embedded_model_path
from respd.engines.llamacpp import LlamaCppEngine
from tests.support.servers import MODEL_ID

SAY_HI = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def token_of() -> Iterator[dict[str, int]]:
    """Token ids of a few words, from the model's own tokenizer."""
    engine = LlamaCppEngine(
        embedded_model_path(), model_id=MODEL_ID, n_ctx=256, parallel=1, n_threads=1
    )
    try:
        ids = {word: engine.tokenize(word) for word in ("Hello", " blue")}
        assert all(len(t) == 1 for t in ids.values()), ids  # one token each
        yield {word: t[0] for word, t in ids.items()} | {"n_vocab": engine.n_vocab or 0}
    finally:
        engine.close()


def chat(client: openai.OpenAI, **extra: object) -> tuple[str, int]:
    out = client.chat.completions.create(
        model=MODEL_ID,
        messages=SAY_HI,  # type: ignore[arg-type]
        max_tokens=5,
        temperature=0,
        **extra,  # type: ignore[arg-type]
    )
    assert out.usage is not None
    return out.choices[0].message.content or "", out.usage.completion_tokens


def test_a_negative_bias_keeps_a_token_out(client: openai.OpenAI, token_of: dict[str, int]) -> None:
    plain, _ = chat(client)
    assert plain.startswith("Hello"), plain  # the greedy answer opens with it
    biased, _ = chat(client, logit_bias={str(token_of["Hello"]): -100})
    assert not biased.startswith("Hello"), biased


def test_a_positive_bias_makes_the_answer(client: openai.OpenAI, token_of: dict[str, int]) -> None:
    text, n = chat(client, logit_bias={str(token_of[" blue"]): 100})
    assert n == 5 and text.split() == ["blue"] * 5, (text, n)


def test_an_id_past_the_vocabulary_is_400(client: openai.OpenAI, token_of: dict[str, int]) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, logit_bias={str(token_of["n_vocab"]): 1})
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "logit_bias"
