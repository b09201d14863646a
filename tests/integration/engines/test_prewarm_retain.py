"""The llama.cpp engine's `prewarm` and `retain`, with the real model in process: a
prewarmed prompt is in the cache for the request that continues it, without a token
generated; a retained prompt's saved KV outlives newer states in a full tier."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from respd.config import embedded_model_path
from respd.engines.base import ChatMessage, GenerationDone, PromptRequest, SamplingParams
from respd.engines.llamacpp import LlamaCppEngine
from tests.support.servers import MODEL_ID

MiB = 2**20
GREEDY = SamplingParams(temperature=0, max_tokens=8)


def facts(topic: str) -> list[ChatMessage]:
    lines = " ".join(
        f"Fact {i}: the {topic} number {i} weighs {3 * i + 1} grams." for i in range(18)
    )
    return [ChatMessage("user", f"Read these facts.\n{lines}\nWhich {topic} is lightest?")]


A, A2 = facts("pebble"), facts("feather")
A_NEXT = [*A, ChatMessage("assistant", "Number 0."), ChatMessage("user", "And heaviest?")]
B = [ChatMessage("user", "Say hi.")]


def make_engine(ram_mb: int = 0) -> LlamaCppEngine:
    return LlamaCppEngine(
        embedded_model_path(),
        model_id=MODEL_ID,
        n_ctx=1024,
        n_threads=2,
        parallel=1,
        kv_cache_ram_bytes=ram_mb * MiB,
    )


@pytest.fixture()
def engine() -> Iterator[LlamaCppEngine]:
    eng = make_engine()
    yield eng
    eng.close()


def run(
    engine: LlamaCppEngine, messages: list[ChatMessage], *, retain: bool = False
) -> GenerationDone:
    async def main() -> GenerationDone:
        prompt = await engine.prepare(PromptRequest(messages, reserve=8))
        stream = engine.generate(prompt, GREEDY, retain=retain)
        done = None
        async for event in stream:
            if isinstance(event, GenerationDone):
                done = event
        assert done is not None and done.finish_reason in ("stop", "length")
        return done

    return asyncio.run(main())


def test_prewarm_fills_a_slot_without_generating(engine: LlamaCppEngine) -> None:
    async def main() -> tuple[int, int]:
        prompt = await engine.prepare(PromptRequest(A, reserve=8))
        return await engine.prewarm(prompt), prompt.n_tokens

    before = engine.stats().generated_tokens
    cached, n_a = asyncio.run(main())
    assert cached == 0 and n_a > 200
    assert engine.stats().generated_tokens == before  # nothing sampled
    done = run(engine, A_NEXT)
    # all of A's prompt but its reply header, which the next turn spells differently
    assert done.cached_tokens >= n_a - 8, (done.cached_tokens, n_a)
    assert asyncio.run(_prewarm_again(engine)) >= n_a - 8


async def _prewarm_again(engine: LlamaCppEngine) -> int:
    prompt = await engine.prepare(PromptRequest(A, reserve=8))
    return await engine.prewarm(prompt)


@pytest.mark.parametrize("retain", [True, False])
def test_a_retained_state_outlives_newer_ones_in_a_full_tier(retain: bool) -> None:
    # Room for one saved state of these prompts (about 22 KiB a token), not two.
    eng = make_engine(ram_mb=8)
    try:
        n_a = run(eng, A, retain=retain).prompt_tokens
        run(eng, A2)  # A leaves the slot: saved
        run(eng, B)  # A2 leaves the slot: saved, and one of the two must go
        done = run(eng, A_NEXT)
    finally:
        eng.close()
    if retain:
        assert done.cached_tokens >= 0.9 * n_a, (done.cached_tokens, n_a)
    else:  # least recently used first: A went
        assert done.cached_tokens < 64
