"""The llama.cpp engine's end-of-generation block (`ignore_eos`, `min_tokens`), on the real
model in process: the block holds for the whole output or comes off at `min_tokens`, with
greedy and seeded sampling; a grammar-constrained output still ends where its grammar
does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from respd.engines.base import (
    ChatMessage,
    GenerationDone,
    PromptRequest,
    SamplingParams,
)
from respd.engines.constraints import Constraint
from respd.engines.llamacpp import LlamaCppEngine
from tests.support.engine import collect, embedded_engine


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    eng = embedded_engine(n_ctx=512, parallel=2)
    yield eng
    eng.close()


def run(
    engine: LlamaCppEngine, params: SamplingParams, constraint: Constraint | None = None
) -> tuple[str, GenerationDone]:
    async def main() -> tuple[str, GenerationDone]:
        request = PromptRequest([ChatMessage("user", "Say hi.")], constraint=constraint)
        out = await collect(engine, await engine.prepare(request), params)
        return out.text, out.finished

    return asyncio.run(main())


def test_min_tokens_lifts_the_block_once_reached(engine: LlamaCppEngine) -> None:
    _, plain = run(engine, SamplingParams(temperature=0, max_tokens=100))
    assert plain.finish_reason == "stop" and plain.completion_tokens < 30, plain
    # Blocked up to 30 tokens, then free to end: it stops on its own before 100.
    _, done = run(engine, SamplingParams(temperature=0, max_tokens=100, min_tokens=30))
    assert done.finish_reason == "stop", done
    assert 30 <= done.completion_tokens < 100, done


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_tokens=48, ignore_eos=True),
        SamplingParams(seed=7, max_tokens=48, ignore_eos=True, presence_penalty=0.5),
        SamplingParams(seed=7, max_tokens=48, ignore_eos=True, min_tokens=5),
    ],
    ids=["greedy", "seeded-penalties", "with-min-tokens"],
)
def test_ignore_eos_runs_to_max_tokens(engine: LlamaCppEngine, params: SamplingParams) -> None:
    text, done = run(engine, params)
    assert (done.finish_reason, done.completion_tokens) == ("length", 48), done
    assert text


def test_a_grammar_still_ends_its_output(engine: LlamaCppEngine) -> None:
    schema = {"type": "object", "properties": {"greeting": {"type": "string"}}}
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True, min_tokens=150)
    text, done = run(engine, params, Constraint(answer=schema))
    # A finished JSON value admits nothing but the end: blocking it there would leave no
    # token to sample, so the grammar's end stands and the value comes back whole.
    assert done.finish_reason == "stop" and done.completion_tokens < 150, done
    assert isinstance(json.loads(text), dict), text
