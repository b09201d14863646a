"""KV states that outlive their slot, with the real model in process: a prompt whose slot
was taken by an unrelated one is restored from the RAM tier (or, after a restart, the disk
tier) instead of prefilled, and what it then generates is what a fresh prefill gives."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from respd.config import embedded_model_path
from respd.engines.base import (
    ChatMessage,
    GenerationDone,
    PromptRequest,
    SamplingParams,
)
from respd.engines.llamacpp import LlamaCppEngine
from respd.engines.llamacpp.kvtier import HEADER
from tests.support.engine import capture_first_logits, collect
from tests.support.servers import MODEL_ID

FACTS = " ".join(
    f"Fact {i}: the {c} lighthouse on island {i} was painted {c} in {1900 + 7 * i}."
    for i, c in enumerate(["red", "blue", "green", "white", "black", "grey"] * 3)
)
A = [ChatMessage("user", f"Read these facts carefully.\n{FACTS}\nSay which island is green.")]
A_NEXT = [*A, ChatMessage("assistant", "Island 2."), ChatMessage("user", "And which is red?")]
B = [ChatMessage("user", "Write one short line about the sea.")]
GREEDY = SamplingParams(temperature=0, max_tokens=24)
MiB = 2**20


def make_engine(**tiers: Any) -> LlamaCppEngine:
    return LlamaCppEngine(
        embedded_model_path(), model_id=MODEL_ID, n_ctx=1024, n_threads=2, parallel=1, **tiers
    )


@pytest.fixture()
def tiered() -> Iterator[LlamaCppEngine]:
    eng = make_engine(kv_cache_ram_bytes=64 * MiB)
    yield eng
    eng.close()


@pytest.fixture()
def plain() -> Iterator[LlamaCppEngine]:
    eng = make_engine()
    yield eng
    eng.close()


def indexed(engine: LlamaCppEngine) -> None:
    """Wait for the disk tier's start-up scan (it runs in the background)."""
    tier = engine._kv_tier
    assert tier is not None and tier.wait_indexed(30)


def run(engine: LlamaCppEngine, messages: list[ChatMessage]) -> tuple[str, GenerationDone, int]:
    """Greedy text, the done event and the prompt's token count."""

    async def main() -> tuple[str, GenerationDone, int]:
        prompt = await engine.prepare(PromptRequest(messages, reserve=GREEDY.max_tokens or 1))
        out = await collect(engine, prompt, GREEDY)
        assert out.finished.finish_reason in ("stop", "length"), out.done
        return out.text, out.finished, prompt.n_tokens

    return asyncio.run(main())


def test_a_prompt_evicted_from_its_slot_is_restored(
    tiered: LlamaCppEngine, plain: LlamaCppEngine
) -> None:
    _, done_a, n_a = run(tiered, A)
    assert n_a >= 200 and done_a.cached_tokens == 0
    _, done_b, _ = run(tiered, B)  # the only slot now holds B; A's cache was saved first
    assert done_b.cached_tokens < 64
    assert tiered.stats().all_details()["kv_cache_ram_bytes"] > 0
    text, done, _ = run(tiered, A_NEXT)
    assert done.cached_tokens >= 0.9 * n_a, (done.cached_tokens, n_a)
    assert tiered.stats().all_details()["kv_restored_tokens"] == done.cached_tokens
    fresh_text, fresh, _ = run(plain, A_NEXT)
    assert fresh.cached_tokens == 0
    assert text == fresh_text and done.completion_tokens == fresh.completion_tokens


def test_each_turn_of_a_conversation_is_saved_though_it_adds_few_tokens(
    tiered: LlamaCppEngine,
) -> None:
    """A turn adds a short instruction and a short answer, far fewer tokens than a whole
    prompt must hold to be saved at all; its sequence is saved all the same, so the turn
    after it restores everything up to its own new message."""
    run(tiered, A)
    run(tiered, B)
    answer, _, n_next = run(tiered, A_NEXT)
    saved = tiered.stats().all_details()["kv_cache_ram_bytes"]
    run(tiered, B)  # A_NEXT's sequence (A's entry plus under 64 tokens) leaves the slot
    assert tiered.stats().all_details()["kv_cache_ram_bytes"] > saved
    third = [*A_NEXT, ChatMessage("assistant", answer), ChatMessage("user", "And white?")]
    _, done, n_third = run(tiered, third)
    assert done.cached_tokens >= n_next, (done.cached_tokens, n_next, n_third)


def test_restored_prefix_gives_the_logits_of_a_fresh_prefill(
    tiered: LlamaCppEngine, plain: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The restored bytes are the KV cells exactly, so the next-token logits match a fresh
    engine that prefilled the same prefix and then the same tail: tolerance 1e-5 (float
    noise only; same kernels and batch shapes, so in practice bit-equal). Against one
    prefill of the whole prompt in a single batch the logits move by llama.cpp's
    batch-shape rounding, as ordinary prefix reuse does; there the greedy token agrees."""
    restored_rows = capture_first_logits(tiered, monkeypatch)
    fresh_rows = capture_first_logits(plain, monkeypatch)
    run(tiered, A)
    run(tiered, B)
    _, restored, _ = run(tiered, A_NEXT)
    assert restored.cached_tokens > 0 and tiered.stats().all_details()["kv_restored_tokens"] > 0
    run(plain, A)  # the same prefix prefilled the same way, kept in its slot
    _, reused, _ = run(plain, A_NEXT)
    assert reused.cached_tokens == restored.cached_tokens
    restored_row, fresh_row = restored_rows[2], fresh_rows[1]
    assert np.abs(restored_row - fresh_row).max() < 1e-5
    single, without = make_engine(), None
    try:
        single_rows = capture_first_logits(single, monkeypatch)
        run(single, A_NEXT)  # one prefill of the whole prompt
        without = single_rows[0]
    finally:
        single.close()
    assert int(np.argmax(without)) == int(np.argmax(restored_row))
    print("max |logit diff| vs a single-batch prefill:", np.abs(without - restored_row).max())


def test_the_disk_tier_survives_a_restart(tmp_path: Path) -> None:
    tiers = {
        "kv_cache_ram_bytes": 64 * MiB,
        "kv_cache_dir": tmp_path,
        "kv_cache_disk_bytes": 256 * MiB,
    }
    first = make_engine(**tiers)
    try:
        _, _, n_a = run(first, A)
        run(first, B)  # evicts A from the slot into the RAM tier
        assert list(tmp_path.iterdir()) == []  # RAM holds it until pushed out or closed
    finally:
        first.close()
    files = list(tmp_path.glob("*.kv"))
    assert len(files) == 1
    assert first.stats().all_details()["kv_cache_disk_bytes"] == files[0].stat().st_size
    second = make_engine(**tiers)
    try:
        indexed(second)
        assert second.stats().all_details()["kv_cache_disk_bytes"] == files[0].stat().st_size
        _, done, _ = run(second, A_NEXT)
        assert done.cached_tokens >= 0.9 * n_a, (done.cached_tokens, n_a)
        assert second.stats().all_details()["kv_restored_tokens"] == done.cached_tokens
    finally:
        second.close()
    # The second engine's slot (A_NEXT and its answer) was written at shutdown beside A's.
    saved = list(tmp_path.glob("*.kv"))
    assert len(saved) == 2
    # Files whose header holds but whose state llama.cpp refuses: prefill as if absent.
    for path in saved:
        data = bytearray(path.read_bytes())
        _, _, n_tokens, key_len, state_len = HEADER.unpack_from(data)
        start = HEADER.size + 4 * n_tokens + key_len
        data[start : start + state_len] = bytes(state_len)
        path.write_bytes(bytes(data))
    third = make_engine(**tiers)
    try:
        indexed(third)
        text, done, _ = run(third, A_NEXT)
        assert done.cached_tokens == 0 and third.stats().all_details()["kv_restored_tokens"] == 0
        assert len(list(tmp_path.glob("*.kv"))) == 1  # the one tried is dropped
        with_plain = make_engine()
        try:
            assert text == run(with_plain, A_NEXT)[0]
        finally:
            with_plain.close()
    finally:
        third.close()
    # Another context layout cannot use these states: the files are dropped at start.
    other = LlamaCppEngine(
        embedded_model_path(), model_id=MODEL_ID, n_ctx=1024, n_threads=2, parallel=2, **tiers
    )
    try:
        indexed(other)
        assert list(tmp_path.glob("*.kv")) == []
        assert other.stats().all_details()["kv_cache_disk_bytes"] == 0
    finally:
        other.close()
