"""Jump-forward decoding in the llama.cpp engine, real model in process: the text a grammar
forces is decoded as a draft (the counters say so, and most of it is taken), and nothing
changes but the steps it takes: greedy output is the same tokens with and without it, for
one job and for concurrent ones, for a schema answer and a forced tool call; logprobs are
the model's own; the cache holds exactly the output; the walk finds the schema's keys;
`auto` measures what a batched token costs once and drafts only where that pays.

The prompts give the model its answer, so its tokens are confident: batches of other shapes
round logits a little differently (see docs/operating/performance.md). Where the model's two
likeliest tokens still lie within that rounding (it depends on the CPU's kernels: AVX-512
ones moved a logprob by 0.04), the runs may part there, and only there."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import llama_cpp
import pytest

from respd.config import embedded_model_path
from respd.engines.base import ChatMessage, Prompt, PromptRequest, SamplingParams, ToolDefinition
from respd.engines.constraints import CallsConstraint, Constraint
from respd.engines.defaults import JumpForward
from respd.engines.llamacpp import LlamaCppEngine
from respd.engines.llamacpp.jumpforward import PAYING_RATIO, Spacing
from tests.support.engine import Output, collect
from tests.support.servers import MODEL_ID

PROFILE = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "email": {"type": "string"},
        "city": {"type": "string"},
        "active": {"type": "boolean"},
        "score": {"type": "number"},
    },
    "required": ["name", "age", "email", "city", "active", "score"],
    "additionalProperties": False,
}
RECORDS = [
    '{"name": "Ada Lovelace", "age": 36, "email": "ada@example.com", "city": "London", '
    '"active": false, "score": 9.5}',
    '{"name": "Alan Turing", "age": 41, "email": "alan@example.org", "city": "Manchester", '
    '"active": true, "score": 8.75}',
    '{"name": "Grace Hopper", "age": 85, "email": "grace@example.net", "city": "Arlington", '
    '"active": false, "score": 10}',
]
WEATHER = ToolDefinition(
    name="get_weather",
    description="Current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
)


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    eng = LlamaCppEngine(
        embedded_model_path(), model_id=MODEL_ID, n_ctx=1024, n_threads=2, parallel=3
    )
    yield eng
    eng.close()


def record_prompt(engine: LlamaCppEngine, record: str, constraint: Constraint) -> Prompt:
    request = PromptRequest(
        [ChatMessage("user", f"Here is a record: {record}. Return it as JSON.")],
        constraint=constraint,
        reserve=120,
    )
    return asyncio.run(engine.prepare(request))


def generate(
    engine: LlamaCppEngine, prompts: list[Prompt], params: SamplingParams, *, jump: JumpForward
) -> tuple[list[Output], int, int]:
    """Run `prompts` concurrently; their runs, and the forced tokens drafted and taken."""
    engine.jump_forward = jump
    before = engine.stats().all_details()

    async def main() -> list[Output]:
        return list(await asyncio.gather(*(collect(engine, p, params) for p in prompts)))

    runs = asyncio.run(main())
    after = engine.stats().all_details()
    drafted = after["jump_forward_tokens"] - before["jump_forward_tokens"]
    accepted = after["jump_forward_accepted"] - before["jump_forward_accepted"]
    assert 0 <= accepted <= drafted
    assert after["draft_tokens"] == before["draft_tokens"]  # no prompt lookup here
    for run in runs:
        assert run.finished.completion_tokens == len(run.tokens)
    return runs, drafted, accepted


GREEDY = SamplingParams(temperature=0, max_tokens=120, logprobs=5)
TIE = 0.15  # nats: two tokens this close are a tie batches of another shape may break


def assert_same_greedy(run: Output, plain: Output) -> None:
    """`run` has `plain`'s tokens, or parts from it at a tie only: where it first differs,
    `plain` ranked `run`'s token within `TIE` of its own (read from the raw logprobs)."""
    pairs = enumerate(zip(run.tokens, plain.tokens, strict=False))  # one may end sooner
    parted = next((i for i, (a, b) in pairs if a != b), None)
    if parted is None:
        assert run.tokens == plain.tokens and run.text == plain.text
        return
    mine, theirs = run.logprobs[parted], plain.logprobs[parted]
    ranked = {t.token: t.logprob for t in theirs.top}
    assert mine.token in ranked, (parted, mine, theirs)
    assert theirs.logprob - ranked[mine.token] <= TIE, (parted, mine, theirs)


def test_schema_output_is_the_same_tokens_with_fewer_steps(engine: LlamaCppEngine) -> None:
    prompt = record_prompt(engine, RECORDS[0], Constraint(answer=PROFILE))
    [plain], drafted_off, _ = generate(engine, [prompt], GREEDY, jump="off")
    [run], drafted, accepted = generate(engine, [prompt], GREEDY, jump="on")
    assert drafted_off == 0
    assert_same_greedy(run, plain)
    value = json.loads(run.text)
    assert set(value) == set(PROFILE["properties"])
    # The keys, quotes, colons and commas came out of drafts: a good part of the output,
    # and most of what was drafted was taken.
    assert accepted >= len(run.tokens) // 4, (drafted, accepted, len(run.tokens))
    assert accepted >= drafted // 2


def test_concurrent_jobs_each_walk_their_own_grammar(engine: LlamaCppEngine) -> None:
    prompts = [record_prompt(engine, r, Constraint(answer=PROFILE)) for r in RECORDS]
    plain, _, _ = generate(engine, prompts, GREEDY, jump="off")
    runs, _, accepted = generate(engine, prompts, GREEDY, jump="on")
    for run, alone in zip(runs, plain, strict=True):
        assert_same_greedy(run, alone)
    assert all(set(json.loads(r.text)) == set(PROFILE["properties"]) for r in runs)
    assert accepted >= sum(len(r.tokens) for r in runs) // 4


def test_forced_tool_call_drafts_the_name_and_keys(engine: LlamaCppEngine) -> None:
    constraint = Constraint(calls=CallsConstraint(tools=(WEATHER,), max_calls=1))
    request = PromptRequest(
        # (Asked as "What is the weather in Paris?" the model is torn between `"` and `",`
        # after the city, within the rounding batches of other shapes bring: see
        # docs/operating/performance.md.)
        [ChatMessage("user", "Call get_weather for Paris in celsius.")],
        tools=[WEATHER],
        constraint=constraint,
        reserve=80,
    )
    prompt = asyncio.run(engine.prepare(request))
    params = SamplingParams(temperature=0, max_tokens=80, logprobs=5)
    [plain], _, _ = generate(engine, [prompt], params, jump="off")
    [run], drafted, accepted = generate(engine, [prompt], params, jump="on")
    assert_same_greedy(run, plain)
    assert "get_weather" in run.text
    # The call's head `{"name": "get_weather", "arguments": {"city": "` is one forced run.
    assert accepted >= 8, (drafted, accepted, run.text)


def test_logprobs_of_drafted_tokens_are_the_models_own(engine: LlamaCppEngine) -> None:
    prompt = record_prompt(engine, RECORDS[1], Constraint(answer=PROFILE))
    params = SamplingParams(temperature=0, max_tokens=60, logprobs=2)
    # Cached first, so that both runs below start alike (the prompt's last token decoded on
    # its own): a fresh prefill's last logits are summed in another order.
    generate(engine, [prompt], params, jump="off")
    [plain], _, _ = generate(engine, [prompt], params, jump="off")
    [run], _, accepted = generate(engine, [prompt], params, jump="on")
    assert accepted > 0
    assert run.tokens == plain.tokens and len(run.logprobs) == len(run.tokens)
    for mine, theirs in zip(run.logprobs, plain.logprobs, strict=True):
        assert mine.token == theirs.token
        # Read from the model's logits at that position (the raw distribution), not a 0
        # for "forced": within a batch-shape rounding of the one-token-a-step value.
        assert mine.logprob == pytest.approx(theirs.logprob, abs=0.05)
        assert [t.token for t in mine.top] == [t.token for t in theirs.top]


def test_a_limit_inside_a_forced_run_cuts_there(engine: LlamaCppEngine) -> None:
    prompt = record_prompt(engine, RECORDS[2], Constraint(answer=PROFILE))
    for limit in (3, 7, 12):
        # (A limit this close also makes the output close its JSON early: the same either way.)
        params = SamplingParams(temperature=0, max_tokens=limit)
        [plain], _, _ = generate(engine, [prompt], params, jump="off")
        [run], _, _ = generate(engine, [prompt], params, jump="on")
        assert run.tokens == plain.tokens and len(run.tokens) == limit
        assert run.finished.finish_reason == "length"
        slot = max(engine._slots, key=lambda s: s.last_used)
        # Nothing decoded past the limit stays in the cache (the last token is never decoded).
        assert slot.tokens == prompt.tokens + run.tokens[:-1]
        assert llama_cpp.llama_memory_seq_pos_max(engine._mem, slot.seq_id) == len(slot.tokens) - 1


def test_the_walk_finds_the_keys_the_schema_forces(engine: LlamaCppEngine) -> None:
    from respd.engines.llamacpp.grammar import GrammarBuilder

    builder = GrammarBuilder()
    grammar_text = builder.build(builder.schema_rule(PROFILE, "answer"))
    worker = engine._worker
    vocab = engine._model.vocab
    grammar = llama_cpp.llama_sampler_init_grammar(vocab, grammar_text.encode(), b"root")
    try:
        spacing = Spacing()
        # Nothing written yet: `{` is forced, then a space or the first key's quote.
        assert worker._forced_text.text(grammar, spacing) == '{"name": "'
        for token in engine._model.tokenize(b"{", add_bos=False, special=False):
            llama_cpp.llama_sampler_accept(grammar, token)
        # An output whose habit is a space after a brace (seen once before), now at `{`.
        spacing.learn("{ }{")
        assert worker._forced_text.text(grammar, spacing) == ' "name": "'
    finally:
        llama_cpp.llama_sampler_free(grammar)


def test_auto_measures_batching_once_and_follows_it() -> None:
    eng = LlamaCppEngine(embedded_model_path(), model_id=MODEL_ID, n_ctx=1024, n_threads=2)
    try:
        assert eng.jump_forward == "auto"
        assert "batch_token_cost_ratio" not in eng.stats().details  # nothing measured yet
        prompt = record_prompt(eng, RECORDS[0], Constraint(answer=PROFILE))
        [auto], drafted, _ = generate(eng, [prompt], GREEDY, jump="auto")
        ratio = eng.stats().details["batch_token_cost_ratio"]
        assert 0 < ratio < 5
        # Drafts exactly where a token in a batch measured cheap enough to pay for them.
        assert (drafted > 0) == (ratio <= PAYING_RATIO)
        [again], _, _ = generate(eng, [prompt], GREEDY, jump="auto")
        assert eng.stats().details["batch_token_cost_ratio"] == ratio  # measured once
        # The measuring decodes left nothing behind: the same output as without drafts.
        [plain], _, _ = generate(eng, [prompt], GREEDY, jump="off")
        assert auto.tokens == again.tokens
        assert_same_greedy(auto, plain)
    finally:
        eng.close()
