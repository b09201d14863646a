"""In-process engine helpers: the embedded model in an engine, one generation read to its end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import llama_cpp
import numpy as np
import pytest

from respd.config import embedded_model_path
from respd.engines.base import (
    GenerationDone,
    Prompt,
    SamplingParams,
    TokenChunk,
    TokenLogprob,
)
from respd.engines.llamacpp import LlamaCppEngine
from tests.support.servers import MODEL_ID


@dataclass
class Output:
    """What one generation produced: its text, token ids, logprobs and done event."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    done: GenerationDone | None = None

    @property
    def finished(self) -> GenerationDone:
        assert self.done is not None
        return self.done


async def collect(engine: LlamaCppEngine, prompt: Prompt, params: SamplingParams) -> Output:
    """Every event of one generation, until its `GenerationDone`."""
    out = Output()
    async for event in engine.generate(prompt, params):
        if isinstance(event, TokenChunk):
            out.text += event.text
            out.tokens += event.token_ids
            out.logprobs += event.logprobs
        elif isinstance(event, GenerationDone):
            out.done = event
    assert out.done is not None
    return out


def capture_first_logits(engine: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record the whole logits row of each request's first sample (the next-token
    distribution right after its prompt), read from llama.cpp before the engine samples."""
    rows: list[Any] = []
    real = engine._worker._sample
    n_vocab = engine._model.n_vocab()

    def sample(job: Any, idx: int) -> None:
        if job.produced == 0:
            logits = llama_cpp.llama_get_logits_ith(engine._ctx.ctx, idx)
            rows.append(np.ctypeslib.as_array(logits, shape=(n_vocab,)).copy())
        real(job, idx)

    monkeypatch.setattr(engine._worker, "_sample", sample)
    return rows


def embedded_engine(*, n_ctx: int, parallel: int, **options: Any) -> LlamaCppEngine:
    """The embedded model in an in-process engine on two threads."""
    return LlamaCppEngine(
        embedded_model_path(),
        model_id=MODEL_ID,
        n_ctx=n_ctx,
        n_threads=2,
        parallel=parallel,
        **options,
    )
