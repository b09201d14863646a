"""The llama.cpp engine survives per-request faults: penalties work, a request whose
sampler cannot be built fails alone, and a dead worker makes /health unhealthy instead of
leaving requests hanging. Real model, in process; faults are injected by replacing one
engine method for one request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import llama_cpp
import pytest

from respd.api.app import create_app
from respd.config import embedded_model_path
from respd.engines.base import (
    ChatMessage,
    EngineBusy,
    GenerationDone,
    GenerationStream,
    PromptRequest,
    SamplingParams,
)
from respd.engines.llamacpp import LlamaCppEngine
from tests.support.engine import collect
from tests.support.servers import MODEL_ID


@pytest.fixture()
def engine() -> Iterator[LlamaCppEngine]:
    eng = LlamaCppEngine(
        embedded_model_path(), model_id=MODEL_ID, n_ctx=512, n_threads=2, parallel=2
    )
    yield eng
    eng.close()


async def _run(engine: LlamaCppEngine, params: SamplingParams) -> tuple[str, GenerationDone]:
    prompt = await engine.prepare(PromptRequest([ChatMessage("user", "Say hello.")], reserve=16))
    out = await collect(engine, prompt, params)
    return out.text, out.finished


def test_penalties_generate(engine: LlamaCppEngine) -> None:
    async def main() -> None:
        for params in (
            SamplingParams(max_tokens=12, presence_penalty=0.5, seed=1),
            SamplingParams(max_tokens=12, frequency_penalty=1.5, temperature=0),
            SamplingParams(max_tokens=12, repeat_penalty=1.3, temperature=0),
        ):
            text, done = await _run(engine, params)
            assert done.finish_reason in ("stop", "length"), done
            assert done.completion_tokens > 0 and text

    asyncio.run(main())
    assert engine.stats().healthy


def test_a_failing_sampler_fails_only_its_request(
    engine: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = engine._worker._make_sampler
    calls = {"n": 0}

    def flaky(params: SamplingParams, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise TypeError("a sampler that cannot be built")
        return real(params, **kw)

    monkeypatch.setattr(engine._worker, "_make_sampler", flaky)

    async def main() -> list[GenerationDone]:
        params = SamplingParams(max_tokens=8, temperature=0)
        results = await asyncio.gather(_run(engine, params), _run(engine, params))
        return [done for _, done in results]

    failed, served = sorted(asyncio.run(main()), key=lambda d: d.finish_reason != "error")
    assert failed.finish_reason == "error" and "cannot be built" in (failed.error or "")
    assert served.finish_reason in ("stop", "length")
    stats = engine.stats()
    assert stats.healthy and stats.failed == 1 and stats.running == 0
    # The worker is still serving.
    _, after = asyncio.run(_run(engine, SamplingParams(max_tokens=4, temperature=0)))
    assert after.finish_reason in ("stop", "length")


def test_a_failed_decode_step_leaves_no_slot_claiming_a_cache(
    engine: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    params = SamplingParams(max_tokens=6, temperature=0)
    first, _ = asyncio.run(_run(engine, params))
    held = [s for s in engine._slots if s.tokens]
    assert held  # the finished request's slot keeps its tokens for the next one
    real = llama_cpp.llama_decode
    calls = {"n": 0}

    def failing_once(ctx: Any, batch: Any) -> int:
        calls["n"] += 1
        return -1 if calls["n"] == 1 else int(real(ctx, batch))

    monkeypatch.setattr(llama_cpp, "llama_decode", failing_once)

    async def other() -> GenerationDone:
        prompt = await engine.prepare(PromptRequest([ChatMessage("user", "Name a colour.")]))
        return (await collect(engine, prompt, params)).finished

    failed = asyncio.run(other())
    assert failed.finish_reason == "error" and "llama_decode" in (failed.error or "")
    # The cache was cleared: a slot that kept its tokens would serve a prefix that is gone.
    assert all(not s.tokens for s in engine._slots)
    again, done = asyncio.run(_run(engine, params))
    assert done.cached_tokens == 0 and again == first


def test_a_batch_smaller_than_the_slots_still_steps_every_sequence() -> None:
    eng = LlamaCppEngine(
        embedded_model_path(), model_id=MODEL_ID, n_ctx=512, n_threads=2, parallel=4, n_batch=2
    )
    try:

        async def main() -> list[GenerationDone]:
            params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
            return [d for _, d in await asyncio.gather(*(_run(eng, params) for _ in range(4)))]

        for done in asyncio.run(main()):
            assert done.finish_reason == "length" and done.completion_tokens == 8
        assert eng.stats().healthy
    finally:
        eng.close()


def test_a_consumer_whose_loop_closed_does_not_stop_the_worker(engine: LlamaCppEngine) -> None:
    """A caller that stops reading after the first event and closes its event loop leaves
    a job whose events have nowhere to go; that job ends, the worker goes on."""

    async def first_event_only() -> GenerationStream:
        prompt = await engine.prepare(PromptRequest([ChatMessage("user", "Count to 50.")]))
        stream = engine.generate(prompt, SamplingParams(max_tokens=200, temperature=0))
        await anext(aiter(stream))
        return stream

    loop = asyncio.new_event_loop()
    abandoned = loop.run_until_complete(first_event_only())  # held open, never read again
    loop.close()  # the job's next event finds a closed loop
    time.sleep(0.5)
    _, done = asyncio.run(_run(engine, SamplingParams(max_tokens=8, temperature=0)))
    assert done.finish_reason in ("stop", "length")
    stats = engine.stats()
    assert stats.healthy, stats
    del abandoned


def test_a_dead_worker_is_unhealthy_and_fails_requests(
    engine: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    def die() -> None:
        raise SystemExit("the worker was killed")

    app = create_app(engine)

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            assert (await http.get("/health")).status_code == 200
            monkeypatch.setattr(engine._worker, "_step_once", die)
            _, done = await asyncio.wait_for(_run(engine, SamplingParams(max_tokens=8)), timeout=30)
            assert done.finish_reason == "error"
            health = await http.get("/health")
            assert health.status_code == 503
            assert health.json()["status"] == "unhealthy"
            assert "killed" in health.json()["engine"]["problem"]
            r = await http.post("/v1/responses", json={"model": MODEL_ID, "input": "hi"})
            assert r.status_code == 503
            assert r.json()["error"]["code"] == "server_is_overloaded"

    asyncio.run(main())
    with pytest.raises(EngineBusy):
        asyncio.run(_gen_now(engine))


async def _gen_now(engine: LlamaCppEngine) -> None:
    prompt = await engine.prepare(PromptRequest([ChatMessage("user", "x")]))
    engine.generate(prompt, SamplingParams(max_tokens=1))
