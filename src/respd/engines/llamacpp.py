"""The default engine: GGUF models through llama.cpp, with continuous batching.

One llama.cpp context holds `parallel` sequences, each in its own KV stream. A worker thread runs
the decode loop: every step it puts one token of each generating sequence, plus a chunk of
any prompt still being prefilled, into a single batch, decodes it, and samples each sequence
with its own sampler chain. New requests join at the next step; a finished or cancelled
sequence frees its slot at once. Prompts reuse the longest prefix any slot holds (see
`slots.py`). The event loop never blocks on a decode: results cross to it through
`call_soon_threadsafe`.

With a projector (`mmproj`, see `multimodal.py`) prompts may hold images: each image chunk
takes its positions in the token list as placeholder ids; the worker decodes text through
the shared batch as usual and, between steps, encodes an image chunk and decodes its
embeddings into that sequence alone (at most one image per step).
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
from respd.engines.multimodal import ImageChunk, Projector, ProjectorError
from respd.engines.slots import Slot, place

log = logging.getLogger(__name__)

# Special tokens that end an assistant turn in the common template families; each counts
# as a stop token when the vocabulary has it as a single token and the template uses it.
_END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")
# Markers the service reads in generated text (thinking, tool calls). Tokens are decoded
# with special=False, which drops control tokens; a marker the vocabulary holds as one
# control token (Command R7B's <|START_THINKING|>, gpt-oss's channels, Llama 3's
# <|python_tag|>, ...) and the template uses is therefore decoded as its text instead.
_TEXT_MARKERS = (
    "<think>",
    "</think>",
    "<|START_THINKING|>",
    "<|END_THINKING|>",
    "[THINK]",
    "[/THINK]",
    "<seed:think>",
    "</seed:think>",
    "<|channel|>",
    "<|message|>",
    "<|start|>",
    "<|end|>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "<tool_call>",
    "</tool_call>",
)
# Where an image goes in rendered text (llama.cpp's own multimodal marker).
MEDIA_MARKER = "<__media__>"


def cpu_advertises_amx() -> bool:
    """Whether /proc/cpuinfo lists AMX (Linux only; elsewhere False)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(line.startswith("flags") and " amx_int8" in line for line in cpuinfo.splitlines())


@dataclass(eq=False)
class _Job:
    prompt: list[int]
    params: SamplingParams
    cache_key: str | None
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[GenerationEvent]
    # Image chunks of the prompt: (start position, chunk), in order.
    images: list[tuple[int, ImageChunk]] = field(default_factory=list)
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

    def spans(self) -> list[tuple[int, int]]:
        return [(start, chunk.n_tokens) for start, chunk in self.images]

    def image_at(self, pos: int) -> ImageChunk | None:
        """The image chunk starting at prompt position `pos`, if one does."""
        for start, chunk in self.images:
            if start == pos:
                return chunk
        return None

    def next_image_start(self, pos: int) -> int:
        """Where the first image chunk at or after `pos` starts (the prompt end if none)."""
        for start, _ in self.images:
            if start >= pos:
                return start
        return len(self.prompt)


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
        repack: bool | None = None,
        mmproj: Path | None = None,
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
        # Repacked (AMX / tiled) weight buffers are faster where they work, but ggml's AMX
        # kernels segfault in some VMs that advertise AMX; `--repack` decides.
        mparams.use_extra_bufts = (not cpu_advertises_amx()) if repack is None else repack
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
        self._projector: Projector | None = None
        if mmproj is not None:
            try:
                self._projector = Projector(
                    mmproj,
                    self._model,
                    n_threads=n_threads,
                    n_batch=self._n_batch,
                    marker=MEDIA_MARKER,
                )
            except ProjectorError:
                self._release_native()
                raise
            self.vision = True
        meta = self._model.metadata()
        source = chat_template or meta.get("tokenizer.chat_template") or FALLBACK_TEMPLATE
        self.template_source = source
        self.template = ChatTemplate(
            source,
            bos_token=self._token_text(self._model.token_bos()),
            eos_token=self._token_text(self._model.token_eos()),
        )
        self._stop_ids = self._end_of_turn_ids(source)
        self._text_marker_ids = self._marker_ids(source) - self._stop_ids
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
        harmony = "<|channel|>" in template_source  # gpt-oss: <|end|> ends a message, not the turn
        for marker in _END_OF_TURN_MARKERS:
            if harmony and marker == "<|end|>":
                continue
            if marker in template_source:
                toks = self.tokenize(marker)
                if len(toks) == 1:
                    ids.add(toks[0])
        return frozenset(t for t in ids if t >= 0)

    def _marker_ids(self, template_source: str) -> frozenset[int]:
        ids = set()
        for marker in _TEXT_MARKERS:
            if marker in template_source:
                toks = self.tokenize(marker)
                if len(toks) == 1 and not self._model.detokenize(toks, special=False):
                    ids.add(toks[0])
        return frozenset(ids)

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
        if not images:
            return self._text_tokens(prompt)
        if self._projector is None:
            raise ValueError(f"the model '{self.model_id}' has no image input")
        parts = prompt.split(self.media_marker)
        if len(parts) - 1 != len(images):
            raise ValueError(
                f"the prompt has {len(parts) - 1} image markers for {len(images)} images"
            )
        # Text between markers is tokenized piece by piece, as mtmd itself does.
        tokens: list[int] = []
        for i, part in enumerate(parts):
            if part:
                tokens.extend(self._text_tokens(part))
            if i < len(images):
                tokens.extend(self._projector.image(images[i]).tokens)
        if not tokens or tokens[-1] < 0:
            raise ValueError("the prompt must not end with an image")
        return tokens

    def _text_tokens(self, text: str) -> list[int]:
        # The rendered template already carries any BOS it wants; special tokens in it
        # (e.g. <|im_start|>) must map to their ids.
        return self._model.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def _image_spans(
        self, prompt: Sequence[int], images: Sequence[Image]
    ) -> list[tuple[int, ImageChunk]]:
        """Where each image chunk sits in `prompt` (as `tokenize` placed them)."""
        n_placeholders = sum(1 for t in prompt if t < 0)
        if not images:
            if n_placeholders:
                raise ValueError("the prompt holds image positions but no images were given")
            return []
        if self._projector is None:
            raise ValueError(f"the model '{self.model_id}' has no image input")
        spans: list[tuple[int, ImageChunk]] = []
        pos = 0
        for image in images:
            for chunk in self._projector.image(image).chunks:
                try:
                    start = prompt.index(chunk.placeholders[0], pos)
                except ValueError:
                    raise ValueError("the prompt does not hold the images given") from None
                end = start + chunk.n_tokens
                if list(prompt[start:end]) != chunk.placeholders:
                    raise ValueError("the prompt does not hold the images given")
                spans.append((start, chunk))
                pos = end
        if n_placeholders != sum(chunk.n_tokens for _, chunk in spans):
            raise ValueError("the prompt holds image positions of images not given")
        if prompt[-1] < 0:
            raise ValueError("the prompt must not end with an image")
        return spans

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
        spans = self._image_spans(prompt_tokens, images)
        job = _Job(
            list(prompt_tokens),
            params,
            cache_key,
            asyncio.get_running_loop(),
            asyncio.Queue(),
            images=spans,
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
            placement = place(self._slots, job.prompt, job.cache_key, job.spans())
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
        # Between steps (the last step's logits are sampled already): at most one image
        # chunk, decoded into its own sequence alone.
        for job in running:
            chunk = job.image_at(job.fed)
            if chunk is not None:
                self._feed_image(job, chunk)
                break
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
            # Text up to the next image; the image itself goes in between steps.
            take = min(job.next_image_start(job.fed) - job.fed, self._n_batch - n)
            if take <= 0:
                continue
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

    def _feed_image(self, job: _Job, chunk: ImageChunk) -> None:
        """Encode an image chunk (unless cached) and decode it into the job's sequence; a
        failure fails this job only."""
        assert job.slot is not None and self._projector is not None
        slot = job.slot
        try:
            embd = self._projector.embeddings(chunk)
            self._projector.decode(self._ctx.ctx, chunk, embd, job.fed, slot.seq_id)
        except Exception as exc:
            log.warning("image failed for a request: %s", exc)
            llama_cpp.llama_memory_seq_rm(self._mem, slot.seq_id, -1, -1)
            slot.tokens = []
            self._finish(job, "error", error=str(exc))
            return
        slot.tokens.extend(chunk.placeholders)
        job.fed += chunk.n_tokens

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
        piece = self._model.detokenize([token], special=token in self._text_marker_ids)
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
        # Last, so whoever reads it sees the slot free and the counters updated.
        job.emit(GenerationDone(reason, len(job.prompt), job.produced, job.cached, error=error))

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify()
        self._worker.join(timeout=5)
        self._release_native()

    def _release_native(self) -> None:
        if self._projector is not None:
            self._projector.close()
            self._projector = None
        llama_cpp.llama_batch_free(self._batch)
        self._ctx.close()
        self._model.close()
