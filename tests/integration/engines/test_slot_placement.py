"""Slot placement with the real model in process: conversations that share a system prompt
keep their own slots (the shared prefix is copied, not taken over), a repeated prompt
reuses all of itself, and the copied prefix gives the same greedy text as a fresh one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from respd.engines.base import ChatMessage, GenerationDone, PromptRequest, SamplingParams
from respd.engines.llamacpp import LlamaCppEngine
from tests.support.engine import collect, embedded_engine

SYSTEM = ChatMessage(
    "system",
    "You are a terse assistant for a harbour office. Answer in one short sentence, "
    "name ships exactly as written, and never invent schedules you were not given.",
)
A = [SYSTEM, ChatMessage("user", "Which ship leaves first, the Aurora or the Bell?")]
B = [SYSTEM, ChatMessage("user", "Write one line about the morning tide.")]
GREEDY = SamplingParams(temperature=0, max_tokens=16)


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    eng = embedded_engine(n_ctx=1024, parallel=4)
    yield eng
    eng.close()


def run(engine: LlamaCppEngine, messages: list[ChatMessage]) -> tuple[str, GenerationDone, int]:
    async def main() -> tuple[str, GenerationDone, int]:
        prompt = await engine.prepare(PromptRequest(messages, reserve=16))
        out = await collect(engine, prompt, GREEDY)
        return out.text, out.finished, prompt.n_tokens

    return asyncio.run(main())


def test_alternating_conversations_each_keep_their_slot(engine: LlamaCppEngine) -> None:
    a_text, _, a_len = run(engine, A)
    b_text, b_done, b_len = run(engine, B)
    # B shares the system prompt with A's slot: that prefix is reused (copied over)...
    assert b_done.cached_tokens >= 30, b_done
    # ...and A's slot keeps A: asked again, A and then B reuse all but their last token.
    a2_text, a2_done, _ = run(engine, A)
    b2_text, b2_done, _ = run(engine, B)
    assert a2_done.cached_tokens == a_len - 1, a2_done
    assert b2_done.cached_tokens == b_len - 1, b2_done
    # A copied or reused prefix decodes exactly as a fresh prefill did.
    assert (a2_text, b2_text) == (a_text, b_text)


def test_a_copied_prefix_matches_a_fresh_prefill() -> None:
    fresh = embedded_engine(n_ctx=1024, parallel=2)
    try:
        cold_text, cold_done, _ = run(fresh, B)
        assert cold_done.cached_tokens == 0
    finally:
        fresh.close()
    shared = embedded_engine(n_ctx=1024, parallel=2)
    try:
        run(shared, A)
        text, done, _ = run(shared, B)  # the system prompt comes from A's slot
        assert done.cached_tokens >= 30
        assert text == cold_text
    finally:
        shared.close()
