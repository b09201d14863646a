"""Prompt-lookup speculation in the llama.cpp engine, real model in process: drafts are
taken (the counters say so) and change nothing but speed: greedy output is the same tokens
as without them, alone and with concurrent jobs, under a grammar, with logprobs, and when a
stop token, `max_tokens` or the context window ends the output inside a draft; the cache
then holds exactly the tokens decoded for the output.

The prompts ask the model to repeat text it wrote (with the reply's first words given), so
it copies with confident tokens: batches of other shapes round logits a little differently
(see docs/operating/performance.md), which must not decide any token here."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import llama_cpp
import pytest

from respd.config import embedded_model_path
from respd.engines.base import (
    ChatMessage,
    Prompt,
    PromptRequest,
    SamplingParams,
)
from respd.engines.constraints import Constraint
from respd.engines.llamacpp import LlamaCppEngine
from respd.engines.llamacpp.slots import Slot
from respd.engines.llamacpp.speculation import NgramSpeculation
from tests.support.engine import Output, collect
from tests.support.servers import MODEL_ID

SPECULATION = NgramSpeculation(draft_max=8, ngram_min=3, ngram_max=5)
LIGHTHOUSE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the "
    "wick, polished the great lens and wrote the weather in a leather book. Ships passed "
    "safely through the narrow channel, and nobody in the village ever learned his name."
)
FOX = "The quick brown fox jumps over the lazy dog."
BAKER = (
    "Every morning the baker lit the oven before sunrise, kneaded twelve loaves of rye and "
    "set them on the windowsill to cool, where the whole street could smell them."
)
GREEDY = SamplingParams(temperature=0, max_tokens=80)


@pytest.fixture()
def engine() -> Iterator[LlamaCppEngine]:
    eng = LlamaCppEngine(
        embedded_model_path(),
        model_id=MODEL_ID,
        n_ctx=512,
        n_threads=2,
        parallel=3,
        speculation=SPECULATION,
    )
    yield eng
    eng.close()


def repeat_prompt(engine: LlamaCppEngine, text: str, words: int = 3) -> Prompt:
    """The model said `text`; asked to say it again, its reply starts with `words` words."""
    rendered = engine.render_prompt(
        [
            ChatMessage("user", "Write a few sentences."),
            ChatMessage("assistant", text),
            ChatMessage("user", "Say that again, word for word."),
        ]
    )
    opening = " ".join(text.split(" ")[:words])
    return engine.prompt_of(engine.tokenize(rendered + opening))


async def _run(engine: LlamaCppEngine, prompt: Prompt, params: SamplingParams) -> Output:
    run = await collect(engine, prompt, params)
    assert run.finished.completion_tokens == len(run.tokens)
    return run


def generate(
    engine: LlamaCppEngine,
    prompts: list[Prompt],
    params: SamplingParams,
    *,
    speculation: bool,
) -> tuple[list[Output], int, int]:
    """Run `prompts` concurrently; their runs, and the draft tokens decoded and accepted."""
    engine.speculation = SPECULATION if speculation else None
    before = engine.stats()

    async def main() -> list[Output]:
        return list(await asyncio.gather(*(_run(engine, p, params) for p in prompts)))

    runs = asyncio.run(main())
    after = engine.stats()
    drafted = after.all_details()["draft_tokens"] - before.all_details()["draft_tokens"]
    accepted = after.all_details()["draft_accepted"] - before.all_details()["draft_accepted"]
    assert 0 <= accepted <= drafted
    if not speculation:
        assert drafted == 0
    return runs, drafted, accepted


def last_slot(engine: LlamaCppEngine) -> Slot:
    return max(engine._slots, key=lambda s: s.last_used)


def assert_cache_holds(engine: LlamaCppEngine, slot: Slot, tokens: list[int]) -> None:
    """The slot's bookkeeping and its KV stream both end with exactly `tokens`: no rejected
    draft token was left behind."""
    assert slot.tokens == tokens
    pos_max = llama_cpp.llama_memory_seq_pos_max(engine._mem, slot.seq_id)
    assert pos_max == len(tokens) - 1


def test_greedy_output_is_the_same_with_drafts(engine: LlamaCppEngine) -> None:
    prompt = repeat_prompt(engine, LIGHTHOUSE)
    [plain], _, _ = generate(engine, [prompt], GREEDY, speculation=False)
    [drafted_run], drafted, accepted = generate(engine, [prompt], GREEDY, speculation=True)
    assert drafted_run.tokens == plain.tokens
    assert drafted_run.text == plain.text and "learned his name" in plain.text
    assert drafted_run.done is not None and plain.done is not None
    assert drafted_run.done.finish_reason == plain.done.finish_reason == "stop"
    # The copy came mostly out of drafts: most tokens cost no decode step of their own.
    assert accepted >= len(plain.tokens) // 2, (drafted, accepted, len(plain.tokens))


def test_concurrent_jobs_each_get_their_own_drafts(engine: LlamaCppEngine) -> None:
    prompts = [repeat_prompt(engine, t) for t in (LIGHTHOUSE, BAKER, FOX)]
    plain, _, _ = generate(engine, prompts, GREEDY, speculation=False)
    runs, _, accepted = generate(engine, prompts, GREEDY, speculation=True)
    assert [r.tokens for r in runs] == [r.tokens for r in plain]
    assert "learned his name" in runs[0].text and "smell them" in runs[1].text
    assert "lazy dog" in runs[2].text
    assert accepted >= sum(len(r.tokens) for r in plain) // 2


def test_a_stop_token_inside_a_draft_ends_the_output(
    engine: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    drafts: list[list[int]] = []
    verify = engine._worker._verify

    def recording(job: Any, idx: int) -> None:
        drafts.append(list(job.draft))
        verify(job, idx)

    monkeypatch.setattr(engine._worker, "_verify", recording)
    prompt = repeat_prompt(engine, FOX)
    [plain], _, _ = generate(engine, [prompt], GREEDY, speculation=False)
    [run], drafted, accepted = generate(engine, [prompt], GREEDY, speculation=True)
    assert run.tokens == plain.tokens and run.text == " fox jumps over the lazy dog."
    assert run.done is not None and run.done.finish_reason == "stop"
    # The last draft held the output's end and then the end of turn: its tokens up to
    # there were taken, the end of turn was sampled at a draft position and ended the
    # output, and the draft tokens after it were dropped.
    last = drafts[-1]
    stop_at = next(i for i, t in enumerate(last) if engine._worker._is_stop(t))
    assert 0 < stop_at < len(last) - 1
    assert run.tokens[-stop_at:] == last[:stop_at]
    assert drafted - accepted == len(last) - stop_at
    # The end-of-turn token is not part of the output, nor is anything drafted after it.
    assert_cache_holds(engine, last_slot(engine), prompt.tokens + run.tokens)


@pytest.mark.parametrize("max_tokens", [1, 2, 6, 10, 13])
def test_max_tokens_cuts_the_output_inside_a_draft(engine: LlamaCppEngine, max_tokens: int) -> None:
    prompt = repeat_prompt(engine, LIGHTHOUSE)
    [plain], _, _ = generate(engine, [prompt], GREEDY, speculation=False)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    [run], drafted, accepted = generate(engine, [prompt], params, speculation=True)
    assert run.tokens == plain.tokens[:max_tokens]
    assert run.done is not None and run.done.finish_reason == "length"
    if max_tokens > 2:  # room for a draft after the first two tokens
        assert accepted > 0
    # No draft reached past the limit (the confident copy takes every draft token before it).
    assert drafted == accepted
    # Nothing was decoded past the limit: the last token is output, never decoded.
    assert_cache_holds(engine, last_slot(engine), prompt.tokens + run.tokens[:-1])


def test_drafts_stop_at_the_context_window(engine: LlamaCppEngine) -> None:
    n_prompt = len(repeat_prompt(engine, LIGHTHOUSE).tokens)
    room = 12
    small = LlamaCppEngine(
        embedded_model_path(),
        model_id=MODEL_ID,
        n_ctx=n_prompt + room,
        n_threads=2,
        parallel=1,
        speculation=SPECULATION,
    )
    try:
        prompt = repeat_prompt(small, LIGHTHOUSE)
        params = SamplingParams(temperature=0)
        [plain], _, _ = generate(small, [prompt], params, speculation=False)
        [run], drafted, accepted = generate(small, [prompt], params, speculation=True)
        assert run.tokens == plain.tokens and len(run.tokens) == room
        assert run.done is not None and run.done.finish_reason == "length"
        assert 0 < accepted == drafted  # no draft reached past the window
        assert_cache_holds(small, small._slots[0], prompt.tokens + run.tokens[:-1])
    finally:
        small.close()


def test_drafts_fit_the_batch() -> None:
    # Room for both sequences' next tokens and four draft tokens between them.
    small = LlamaCppEngine(
        embedded_model_path(),
        model_id=MODEL_ID,
        n_ctx=512,
        n_batch=6,
        n_threads=2,
        parallel=2,
        speculation=SPECULATION,
    )
    try:
        prompts = [repeat_prompt(small, t) for t in (LIGHTHOUSE, BAKER)]
        params = SamplingParams(temperature=0, max_tokens=40)
        plain, _, _ = generate(small, prompts, params, speculation=False)
        runs, _, accepted = generate(small, prompts, params, speculation=True)
        assert all(r.done is not None and r.done.error is None for r in runs)
        assert [r.tokens for r in runs] == [r.tokens for r in plain]
        assert accepted > 0
    finally:
        small.close()


def test_constrained_output_takes_drafts_too(engine: LlamaCppEngine) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "city": {"type": "string"},
            "born": {"type": "integer"},
        },
        "required": ["name", "city", "born"],
        "additionalProperties": False,
    }
    record = '{"name": "Ada Lovelace", "city": "London", "born": 1815}'
    request = PromptRequest(
        [ChatMessage("user", f"Here is a record: {record}. Return it as JSON.")],
        constraint=Constraint(answer=schema),
        reserve=60,
    )
    prompt = asyncio.run(engine.prepare(request))
    params = SamplingParams(temperature=0, max_tokens=60)
    [plain], _, _ = generate(engine, [prompt], params, speculation=False)
    [run], _, accepted = generate(engine, [prompt], params, speculation=True)
    assert run.tokens == plain.tokens
    assert json.loads(run.text) == {"name": "Ada Lovelace", "city": "London", "born": 1815}
    assert accepted > 0


def test_logprobs_are_read_where_each_token_was_sampled(engine: LlamaCppEngine) -> None:
    prompt = repeat_prompt(engine, LIGHTHOUSE)
    params = SamplingParams(temperature=0, max_tokens=40, logprobs=2)
    [plain], _, _ = generate(engine, [prompt], params, speculation=False)
    [run], _, accepted = generate(engine, [prompt], params, speculation=True)
    assert accepted > 0
    assert run.tokens == plain.tokens and len(run.logprobs) == len(run.tokens)
    for mine, theirs in zip(run.logprobs, plain.logprobs, strict=True):
        # Greedy: the token drawn is the top of the row its logprob was read from.
        assert mine.top[0].token == mine.token and mine.top[0].logprob == mine.logprob
        assert mine.token == theirs.token
        assert mine.logprob == pytest.approx(theirs.logprob, abs=0.5)


def test_seeded_sampling_with_drafts(engine: LlamaCppEngine) -> None:
    prompt = repeat_prompt(engine, LIGHTHOUSE)
    # The prompt cached first, so both seeded runs below see batches of the same shapes.
    generate(engine, [prompt], SamplingParams(temperature=0, max_tokens=1), speculation=True)
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=60)
    [first], _, accepted = generate(engine, [prompt], params, speculation=True)
    [again], _, _ = generate(engine, [prompt], params, speculation=True)
    assert first.tokens == again.tokens and first.text == again.text
    assert first.done is not None and first.done.finish_reason in ("stop", "length")
    assert 0 < len(first.tokens) <= 60 and first.text.strip()
    assert accepted > 0  # even sampled, a confident copy takes drafts
