"""The default engine: GGUF models through llama.cpp, with continuous batching.

One llama.cpp context holds `parallel` sequences, each in its own KV stream. A worker thread runs
the decode loop: every step it puts one token of each generating sequence, plus a chunk of
any prompt still being prefilled, into a single batch, decodes it, and samples each sequence
with its own sampler chain. New requests join at the next step; a finished or cancelled
sequence frees its slot at once. Prompts reuse the longest prefix any slot holds (see
`slots.py`). The event loop never blocks on a decode: results cross to it through
`call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import codecs
import ctypes
import logging
import random
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import llama_cpp
from llama_cpp import _internals as internals
from llama_cpp._logger import set_verbose as set_llama_verbose

from respd.engines.base import (
    ChatMessage,
    EngineBusy,
    EngineStats,
    FinishReason,
    GenerationDone,
    GenerationEvent,
    GenerationStream,
    Image,
    SamplingParams,
    TokenChunk,
)
from respd.engines.chat_template import FALLBACK_TEMPLATE, ChatTemplate
from respd.engines.grammar_sampler import GrammarCheckedSampler
from respd.engines.logprobs import LogprobReader
from respd.engines.slots import Slot, place

log = logging.getLogger(__name__)

# Special tokens that end an assistant turn in the common template families; each counts
# as a stop token when the vocabulary has it as a single token and the template uses it.
_END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")
# Where an image goes in rendered text (llama.cpp's own multimodal marker).
MEDIA_MARKER = "<__media__>"


@dataclass(eq=False)
class _Job:
    prompt: list[int]
    params: SamplingParams
    cache_key: str | None
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[GenerationEvent]
    cancel: threading.Event = field(default_factory=threading.Event)
    # Set by the worker while the job runs:
    slot: Slot | None = None
    sampler: ctypes.c_void_p | None = None
    grammar: GrammarCheckedSampler | None = None
    cached: int = 0
    fed: int = 0  # prompt tokens decoded so far (including the reused prefix)
    produced: int = 0
    limit: int = 0
    next_token: int | None = None  # sampled, not yet decoded
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )

    def emit(self, event: GenerationEvent) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, event)


class _JobStream:
    """The events of one job. Closing it, or dropping it unread, cancels the job."""

    def __init__(self, job: _Job, release: Callable[[_Job], None]) -> None:
        self._job = job
        self._release = release
        self._done = False

    def __aiter__(self) -> _JobStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        if self._done:
            raise StopAsyncIteration
        event = await self._job.out.get()
        if isinstance(event, GenerationDone):
            self._done = True
        return event

    async def aclose(self) -> None:
        self._done = True
        self._release(self._job)

    def __del__(self) -> None:
        self._job.cancel.set()


class LlamaCppEngine:
    """A GGUF model loaded in-process, serving up to `parallel` sequences at once."""

    def __init__(
        self,
        model_path: Path,
        *,
        model_id: str,
        n_ctx: int = 4096,
        n_threads: int = 2,
        n_batch: int = 512,
        parallel: int = 4,
        max_queue: int = 64,
        chat_template: str | None = None,
        top_k: int = 40,
        min_p: float = 0.05,
    ) -> None:
        self.model_id = model_id
        self.model_path = model_path
        self.vision = False
        self.media_marker = MEDIA_MARKER
        self.parallel = parallel
        self.max_queue = max_queue
        self._top_k = top_k
        self._min_p = min_p
        set_llama_verbose(log.isEnabledFor(logging.DEBUG))  # llama.cpp's own chatter
        llama_cpp.llama_backend_init()
        mparams = llama_cpp.llama_model_default_params()
        self._model = internals.LlamaModel(
            path_model=str(model_path), params=mparams, verbose=False
        )
        self.context_window = n_ctx
        self._n_batch = max(1, min(n_batch, n_ctx))
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx * parallel  # every sequence may use its full window
        cparams.n_batch = self._n_batch
        cparams.n_ubatch = self._n_batch
        cparams.n_seq_max = parallel
        # One KV stream per sequence: attention then spans only that sequence's own cells,
        # not every prefix the other slots keep cached. Sharing a prefix across slots
        # copies the stream (see `_admit_pending`).
        cparams.kv_unified = False
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        cparams.no_perf = True
        self._ctx = internals.LlamaContext(model=self._model, params=cparams, verbose=False)
        self._mem = llama_cpp.llama_get_memory(self._ctx.ctx)
        self._batch = llama_cpp.llama_batch_init(self._n_batch, 0, 1)
        self._vocab = self._model.vocab
        meta = self._model.metadata()
        source = chat_template or meta.get("tokenizer.chat_template") or FALLBACK_TEMPLATE
        self.template_source = source
        self.template = ChatTemplate(
            source,
            bos_token=self._token_text(self._model.token_bos()),
            eos_token=self._token_text(self._model.token_eos()),
        )
        self._stop_ids = self._end_of_turn_ids(source)
        self._slots = [Slot(i) for i in range(parallel)]
        self._pending: deque[_Job] = deque()
        self._admitted = 0  # jobs accepted and not yet finished (running + queued)
        self._lock = threading.Condition()
        self._closing = False
        self._step = 0
        self._stats = EngineStats()
        self._worker = threading.Thread(target=self._work, name="llamacpp-batch", daemon=True)
        self._worker.start()

    # -- rendering and tokens -------------------------------------------------------------

    def _token_text(self, token: int) -> str:
        return self._model.token_get_text(token) if token >= 0 else ""

    def _end_of_turn_ids(self, template_source: str) -> frozenset[int]:
        ids = {self._model.token_eos()}
        for marker in _END_OF_TURN_MARKERS:
            if marker in template_source:
                toks = self.tokenize(marker)
                if len(toks) == 1:
                    ids.add(toks[0])
        return frozenset(t for t in ids if t >= 0)

    def _is_stop(self, token: int) -> bool:
        return token in self._stop_ids or bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def render_prompt(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        extra: dict[str, Any] = dict(template_kwargs or {})
        if tools:
            extra["tools"] = tools
        return self.template.render(
            [m.as_template_dict() for m in messages],
            add_generation_prompt=add_generation_prompt,
            **extra,
        )

    def check_grammar(self, grammar: str) -> None:
        # llama.cpp returns NULL for a grammar it cannot parse; sampling with NULL would
        # crash the process, so every grammar is parsed here first.
        GrammarCheckedSampler(None, self._vocab, grammar, 0).close()

    def tokenize(self, prompt: str, images: Sequence[Image] = ()) -> list[int]:
        if images:
            raise ValueError(f"the model '{self.model_id}' has no image input")
        # The rendered template already carries any BOS it wants; special tokens in it
        # (e.g. <|im_start|>) must map to their ids.
        return self._model.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)

    def stats(self) -> EngineStats:
        with self._lock:
            running = sum(1 for s in self._slots if not s.free)
            return replace(self._stats, running=running, queued=len(self._pending))

    # -- admission ------------------------------------------------------------------------

    def generate(
        self,
        prompt_tokens: list[int],
        params: SamplingParams,
        *,
        cache_key: str | None = None,
        images: Sequence[Image] = (),
    ) -> GenerationStream:
        """Admit a request now (raising `EngineBusy` when slots and queue are full) and
        return its event stream; closing the stream cancels the request."""
        if images:
            raise ValueError(f"the model '{self.model_id}' has no image input")
        job = _Job(
            list(prompt_tokens), params, cache_key, asyncio.get_running_loop(), asyncio.Queue()
        )
        with self._lock:
            if self._closing:
                raise EngineBusy("the engine is shutting down")
            if self._admitted >= self.parallel + self.max_queue:
                raise EngineBusy(
                    f"all {self.parallel} slots are busy and {len(self._pending)} requests "
                    "are queued"
                )
            self._admitted += 1
            self._pending.append(job)
            self._lock.notify()
        return _JobStream(job, self._release)

    def _release(self, job: _Job) -> None:
        if not job.cancel.is_set():
            job.cancel.set()
            with self._lock:
                self._lock.notify()

    # -- the decode loop ------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._closing and not self._pending and all(s.free for s in self._slots):
                    self._lock.wait()
                if self._closing:
                    return
                self._admit_pending()
            try:
                self._step_once()
            except Exception as exc:  # a broken step fails its jobs, never the worker
                log.exception("decode step failed")
                for slot in self._slots:
                    if slot.job is not None:
                        self._finish(slot.job, "error", error=str(exc))
                        slot.tokens = []
                llama_cpp.llama_memory_clear(self._mem, True)

    def _admit_pending(self) -> None:
        """Move queued jobs into free slots (called with the lock held)."""
        while self._pending:
            job = self._pending[0]
            if job.cancel.is_set():
                self._pending.popleft()
                self._finish(job, "cancelled", locked=True)
                continue
            placement = place(self._slots, job.prompt, job.cache_key)
            if placement is None:
                return
            self._pending.popleft()
            slot = placement.slot
            seq = slot.seq_id
            if placement.copy_from is not None:
                # Streams are copied whole (llama.cpp copies the buffer at the next decode);
                # the tail past the shared prefix is then dropped.
                llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)
                llama_cpp.llama_memory_seq_cp(self._mem, placement.copy_from.seq_id, seq, -1, -1)
            llama_cpp.llama_memory_seq_rm(self._mem, seq, placement.reuse, -1)
            slot.tokens = job.prompt[: placement.reuse]
            slot.job = job
            slot.cache_key = job.cache_key
            job.slot = slot
            job.cached = placement.reuse
            job.fed = placement.reuse
            room = self.context_window - len(job.prompt)
            job.limit = room if job.params.max_tokens is None else min(job.params.max_tokens, room)
            job.sampler = self._make_sampler(job.params)
            if job.params.grammar is not None:
                job.grammar = GrammarCheckedSampler(
                    job.sampler, self._vocab, job.params.grammar, self._model.n_vocab()
                )

    def _make_sampler(self, p: SamplingParams) -> ctypes.c_void_p:
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        add = llama_cpp.llama_sampler_chain_add
        if p.presence_penalty or p.frequency_penalty:
            add(
                chain,
                llama_cpp.llama_sampler_init_penalties(
                    64, 1.0, p.frequency_penalty, p.presence_penalty
                ),
            )
        if p.temperature <= 0:
            add(chain, llama_cpp.llama_sampler_init_greedy())
        else:
            seed = p.seed if p.seed is not None else random.getrandbits(32)
            add(chain, llama_cpp.llama_sampler_init_top_k(self._top_k))
            add(chain, llama_cpp.llama_sampler_init_top_p(p.top_p, 1))
            add(chain, llama_cpp.llama_sampler_init_min_p(self._min_p, 1))
            add(chain, llama_cpp.llama_sampler_init_temp(p.temperature))
            add(chain, llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        return chain

    def _step_once(self) -> None:
        """Decode one batch: a token per generating sequence plus prompt chunks."""
        batch = self._batch
        n = 0
        sample_at: list[tuple[_Job, int]] = []
        running = [s.job for s in self._slots if s.job is not None]
        for job in running:
            if job.cancel.is_set():
                self._finish(job, "cancelled")
        running = [s.job for s in self._slots if s.job is not None]
        # Generating sequences first: each needs exactly one position this step.
        for job in running:
            if job.next_token is not None:
                assert job.slot is not None
                self._batch_add(n, job.next_token, len(job.slot.tokens), job.slot.seq_id, True)
                job.slot.tokens.append(job.next_token)
                job.next_token = None
                sample_at.append((job, n))
                n += 1
        # Then prompt chunks in the room left, oldest request first.
        for job in running:
            if job.fed >= len(job.prompt) or n >= self._n_batch:
                continue
            assert job.slot is not None
            take = min(len(job.prompt) - job.fed, self._n_batch - n)
            for i in range(take):
                pos = job.fed + i
                last = pos == len(job.prompt) - 1
                self._batch_add(n, job.prompt[pos], pos, job.slot.seq_id, last)
                if last:
                    sample_at.append((job, n))
                n += 1
            job.slot.tokens.extend(job.prompt[job.fed : job.fed + take])
            job.fed += take
        if n == 0:
            return
        batch.n_tokens = n
        rc = llama_cpp.llama_decode(self._ctx.ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        self._step += 1
        for job, idx in sample_at:
            self._sample(job, idx)

    def _batch_add(self, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        b = self._batch
        b.token[i] = token
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = seq
        b.logits[i] = logits

    def _sample(self, job: _Job, idx: int) -> None:
        if job.cancel.is_set():
            self._finish(job, "cancelled")
            return
        if job.limit <= 0:
            self._finish(job, "length")
            return
        if job.grammar is not None:
            token = job.grammar.sample(self._ctx.ctx, idx)
        else:
            token = llama_cpp.llama_sampler_sample(job.sampler, self._ctx.ctx, idx)
        if self._is_stop(token):
            self._finish(job, "stop")
            return
        job.produced += 1
        self._stats.generated_tokens += 1
        piece = self._model.detokenize([token], special=False)
        chunk = TokenChunk(job.decoder.decode(piece), [token])
        if job.params.logprobs is not None:  # the raw distribution: see engines/logprobs.py
            logits = llama_cpp.llama_get_logits_ith(self._ctx.ctx, idx)
            chunk.logprobs.append(
                self._logprob_reader.read(logits, token, piece, job.params.logprobs)
            )
        job.emit(chunk)
        if job.produced >= job.limit:
            self._finish(job, "length")
        else:
            job.next_token = token

    @cached_property
    def _logprob_reader(self) -> LogprobReader:
        return LogprobReader(
            self._model.n_vocab(), lambda t: self._model.detokenize([t], special=False)
        )

    def _finish(
        self,
        job: _Job,
        reason: FinishReason,
        *,
        error: str | None = None,
        locked: bool = False,
    ) -> None:
        tail = job.decoder.decode(b"", final=True)
        if tail:
            job.emit(TokenChunk(tail, []))
        if job.grammar is not None:
            job.grammar.close()
            job.grammar = None
        if job.sampler is not None:
            llama_cpp.llama_sampler_free(job.sampler)
            job.sampler = None
        job.emit(GenerationDone(reason, len(job.prompt), job.produced, job.cached, error=error))
        if reason == "cancelled":
            self._stats.cancelled += 1
        elif reason != "error":
            self._stats.completed += 1
        slot = job.slot
        if slot is not None:
            slot.job = None
            slot.last_used = self._step
            job.slot = None
        if locked:
            self._admitted -= 1
        else:
            with self._lock:
                self._admitted -= 1

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify()
        self._worker.join(timeout=5)
        llama_cpp.llama_batch_free(self._batch)
        self._ctx.close()
        self._model.close()
