"""Embeddings from a GGUF through llama.cpp: its own context in embedding mode.

The context is separate from the generating engine's (llama.cpp fixes embedding mode per
context), loaded on the first request so a server that never embeds pays nothing, and used
by one request at a time from a thread of its own: requests waiting their turn hold no
thread of the event loop's shared pool, which the store and prompt building use. Pooling
is the GGUF's own (an embedding model declares it); a chat model declares none and is
mean-pooled over its last hidden states."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from respd.engines.embedding import (
    EmbeddingInput,
    Embeddings,
    InputTooLong,
    TokenOutOfRange,
    normalized,
)


class _Stopped(Exception):
    """The request was cancelled: the rest of its inputs are not embedded."""


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class LlamaEmbedder:
    def __init__(
        self,
        path: Path,
        *,
        model_id: str,
        n_ctx: int,
        n_threads: int,
        repack: bool | None = None,
    ) -> None:
        self.model_id = model_id
        self.path = path
        self.max_tokens: int | None = n_ctx
        self._n_ctx = n_ctx
        self._n_threads = n_threads
        self.repack = repack  # as the generating engine's (see loading.load_model)
        self._llama: _Context | None = None
        self._lock = threading.Lock()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"embed-{model_id}")

    async def embed(self, inputs: list[EmbeddingInput]) -> Embeddings:
        """Run in a worker thread; cancelled (the client went away), the thread stops at
        the next input and leaves the context to the next request."""
        stop = threading.Event()
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self._thread, self._embed, inputs, stop)
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            stop.set()
            work.add_done_callback(_retrieved)  # its `_Stopped` is expected, not an error
            raise

    def _embed(self, inputs: list[EmbeddingInput], stop: threading.Event) -> Embeddings:
        if stop.is_set():  # cancelled while it waited its turn
            raise _Stopped
        with self._lock:
            llama = self._loaded()
            sequences = [
                llama.model.tokenize(item.encode(), add_bos=True, special=False)
                if isinstance(item, str)
                else item
                for item in inputs
            ]
            n_vocab = llama.model.n_vocab()
            for i, tokens in enumerate(sequences):
                if any(not 0 <= t < n_vocab for t in tokens):
                    raise TokenOutOfRange(i, n_vocab)
                if len(tokens) > self._n_ctx:
                    raise InputTooLong(i, len(tokens), self._n_ctx)
            vectors = []
            for tokens in sequences:
                if stop.is_set():
                    raise _Stopped  # nobody waits for the rest
                vectors.append(normalized(self._pooled(llama, tokens)))
            return Embeddings(vectors, sum(len(t) for t in sequences))

    def _loaded(self) -> _Context:
        if self._llama is None:
            self._llama = _Context.load(self.path, self._n_ctx, self._n_threads, self.repack)
        return self._llama

    @staticmethod
    def _pooled(llama: _Context, tokens: list[int]) -> list[float]:
        import llama_cpp

        if not tokens:
            return [0.0] * llama.model.n_embd()
        llama.ctx.kv_cache_clear()
        llama.batch.reset()
        llama.batch.add_sequence(tokens, 0, True)
        llama.ctx.decode(llama.batch)
        llama.batch.reset()
        pointer = llama_cpp.llama_get_embeddings_seq(llama.ctx.ctx, 0)
        return list(pointer[: llama.model.n_embd()])

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            if self._llama is not None:
                self._llama.close()
                self._llama = None


@dataclass
class _Context:
    """The embedding context: its own copy of the weights, a context in embedding mode
    whose batch takes a whole input at once, and that batch."""

    model: Any
    ctx: Any
    batch: Any

    @classmethod
    def load(cls, path: Path, n_ctx: int, n_threads: int, repack: bool | None) -> _Context:
        import llama_cpp
        from llama_cpp import _internals as internals

        from respd.engines.llamacpp.loading import load_model

        model = load_model(path, repack)
        declared = _declares_pooling(model.model)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = n_ctx
        params.n_threads = params.n_threads_batch = n_threads
        params.embeddings = True
        params.pooling_type = (
            llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED
            if declared
            else llama_cpp.LLAMA_POOLING_TYPE_MEAN
        )
        ctx = internals.LlamaContext(model=model, params=params, verbose=False)
        batch = internals.LlamaBatch(n_tokens=n_ctx, embd=0, n_seq_max=1, verbose=False)
        return cls(model, ctx, batch)

    def close(self) -> None:
        self.batch.close()
        self.ctx.close()
        self.model.close()


def _declares_pooling(model: Any) -> bool:
    """Whether the loaded GGUF names its pooling (`<arch>.pooling_type`) in its metadata."""
    import ctypes

    import llama_cpp

    buffer = ctypes.create_string_buffer(128)
    size = llama_cpp.llama_model_meta_val_str(model, b"general.architecture", buffer, 128)
    arch = buffer.value.decode() if size > 0 else ""
    key = f"{arch}.pooling_type".encode()
    return int(llama_cpp.llama_model_meta_val_str(model, key, buffer, 128)) >= 0
