"""A rejected first choice under a grammar checks only the likeliest tokens (the window)
when the chain keeps only its top few: the same tokens come out as with a check of the whole
vocabulary, greedy and seeded top-k sampling alike. Greedy, the window served them; top-k
(40) needs 40 allowed tokens in the window, which structural positions (a quote or nothing)
never have, so there the whole vocabulary is checked as before. Closing an answer before its
budget picks its tokens from the window and the closers alike, the same as from the whole
vocabulary."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from respd.config import embedded_model_path
from respd.engines.base import ChatMessage, PromptRequest, SamplingParams
from respd.engines.constraints import Constraint
from respd.engines.llamacpp import LlamaCppEngine, sampler, worker
from tests.support.engine import Output, collect
from tests.support.servers import MODEL_ID

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "year": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["title", "year", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    eng = LlamaCppEngine(embedded_model_path(), model_id=MODEL_ID, n_ctx=1024, n_threads=2)
    eng.jump_forward = "off"
    yield eng
    eng.close()


def run(engine: LlamaCppEngine, params: SamplingParams) -> Output:
    request = PromptRequest(
        # Asked in prose, the model would rather write prose or newlines: its first choice
        # is often rejected by the grammar.
        [ChatMessage("user", "Tell me about a famous old film, its year and a few tags.")],
        constraint=Constraint(answer=SCHEMA),
        reserve=100,
    )
    prompt = asyncio.run(engine.prepare(request))
    return asyncio.run(collect(engine, prompt, params))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_tokens=80),
        SamplingParams(temperature=0.8, top_k=40, seed=11, max_tokens=80),
    ],
    ids=["greedy", "top-k"],
)
def test_the_window_samples_what_the_whole_vocabulary_would(
    engine: LlamaCppEngine, params: SamplingParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[int] = []
    window = sampler.GrammarCheckedSampler._sample_window

    def counting(self: Any, ctx: Any, idx: int) -> int:
        token = int(window(self, ctx, idx))
        served.append(token)
        return token

    monkeypatch.setattr(sampler.GrammarCheckedSampler, "_sample_window", counting)
    windowed = run(engine, params)
    assert served, "no rejected first choice to serve"
    if params.temperature == 0:
        assert any(t >= 0 for t in served)
    monkeypatch.setattr(worker, "chain_top", lambda p, c: None)  # the whole vocabulary
    served.clear()
    whole = run(engine, params)
    assert all(t < 0 for t in served)  # the window never answered
    assert windowed.tokens == whole.tokens and windowed.text == whole.text


def test_chains_that_change_logits_first_check_everything() -> None:
    defaults = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
    context = sampler.ChainContext(defaults=defaults, n_vocab=10)
    assert sampler.chain_top(SamplingParams(temperature=0), context) == 1
    assert sampler.chain_top(SamplingParams(), context) == 40
    assert sampler.chain_top(SamplingParams(top_k=0), context) is None
    assert sampler.chain_top(SamplingParams(temperature=0, repeat_penalty=1.1), context) is None
    assert sampler.chain_top(SamplingParams(temperature=0, logit_bias={1: 2.0}), context) is None
    assert sampler.chain_top(SamplingParams(presence_penalty=0.5), context) is None
    assert sampler.chain_top(SamplingParams(dry_multiplier=0.8), context) is None


def test_closing_from_the_window_picks_what_the_whole_vocabulary_would(
    engine: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A budget so small that the answer closes almost from its first token: every step is a
    # closing step, and those the grammar leaves a choice are decided from the likeliest
    # tokens and the closers when they can be.
    params = SamplingParams(temperature=0, max_tokens=32)
    decided: list[bool] = []
    window = sampler.GrammarCheckedSampler._closing_window

    def counting(self: Any, *args: Any) -> Any:
        picked = window(self, *args)
        decided.append(picked is not None)
        return picked

    monkeypatch.setattr(sampler.GrammarCheckedSampler, "_closing_window", counting)
    windowed = run(engine, params)
    # The steps where the grammar left a choice (forced text is written as it is).
    assert sum(decided) >= 4, decided
    assert json.loads(windowed.text)  # closed before the budget ran out
    monkeypatch.setattr(sampler.GrammarCheckedSampler, "_closing_window", lambda *a: None)
    whole = run(engine, params)
    assert windowed.tokens == whole.tokens and windowed.text == whole.text
    assert windowed.finished.finish_reason == whole.finished.finish_reason == "length"
