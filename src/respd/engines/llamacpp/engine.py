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

A failure that belongs to one request (its sampler cannot be built, its image does not
encode) fails that request alone; the worker goes on. Should the worker itself ever die,
`stats()` says so and every waiting request fails instead of hanging.
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
    Admitted,
    ChatMessage,
    EngineBusy,
    EngineStats,
    FinishReason,
    GenerationDone,
    GenerationEvent,
    GenerationStream,
    Image,
    Prompt,
    PromptRequest,
    SamplingParams,
    TokenChunk,
)
from respd.engines.chat_template import FALLBACK_TEMPLATE, ChatTemplate
from respd.engines.constraints import ConstraintError
from respd.engines.families.profile import MEDIA_MARKER, detect_profile
from respd.engines.llamacpp.grammar import check_schema_for_grammar, compile_constraint
from respd.engines.llamacpp.logprobs import LogprobReader
from respd.engines.llamacpp.multimodal import ImageChunk, Projector, ProjectorError
from respd.engines.llamacpp.sampler import GrammarCheckedSampler
from respd.engines.llamacpp.slots import Slot, place
from respd.engines.prompting import TemplatePrompter

log = logging.getLogger(__name__)

# Sampling when neither the request nor the GGUF metadata says otherwise (llama-server's).
FALLBACK_SAMPLING = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05}
# GGUF keys where a model's authors recommend its sampling (`general.sampling.*`).
SAMPLING_METADATA = {
    "temperature": "general.sampling.temp",
    "top_p": "general.sampling.top_p",
    "top_k": "general.sampling.top_k",
    "min_p": "general.sampling.min_p",
    "repeat_penalty": "general.sampling.penalty_repeat",
}
PENALTY_LAST_N = 64  # tokens the repetition penalties look back over


def cpu_advertises_amx() -> bool:
    """Whether /proc/cpuinfo lists AMX (Linux only; elsewhere False)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(line.startswith("flags") and " amx_int8" in line for line in cpuinfo.splitlines())


def recommended_sampling(metadata: dict[str, str]) -> dict[str, float]:
    """The sampling a GGUF's `general.sampling.*` metadata recommends (what is present)."""
    out: dict[str, float] = {}
    for name, key in SAMPLING_METADATA.items():
        try:
            out[name] = float(metadata[key])
        except (KeyError, ValueError):
            continue
    return out


@dataclass(eq=False)
class _Job:
    prompt: list[int]
    params: SamplingParams
    grammar_text: str | None
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
        try:
            self.loop.call_soon_threadsafe(self.out.put_nowait, event)
        except RuntimeError:
            # The consumer's event loop is closed: nobody reads this job any more, so it
            # ends at the next step like a cancelled one instead of stopping the worker.
            self.cancel.set()

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

    def cancel(self) -> None:
        self._release(self._job)

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
        repack: bool | None = None,
        mmproj: Path | None = None,
        sampling: dict[str, float] | None = None,
    ) -> None:
        """`sampling`: defaults for requests that set none, over the GGUF's own."""
        self.model_id = model_id
        self.model_path = model_path
        self.vision = False
        self.parallel = parallel
        self.max_queue = max_queue
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
        self.profile = detect_profile(source, MEDIA_MARKER)
        # The server's settings over the model authors' sampling over llama-server's
        # defaults; a request's own values override them all.
        self.default_sampling = {
            **FALLBACK_SAMPLING,
            **recommended_sampling(meta),
            **(sampling or {}),
        }
        template = ChatTemplate(
            source,
            bos_token=self._token_text(self._model.token_bos()),
            eos_token=self._token_text(self._model.token_eos()),
        )
        self.prompter = TemplatePrompter(template, self.profile, self.tokenize, n_ctx)
        self._stop_ids = self._single_tokens(self.profile.end_of_turn) | {
            t for t in (self._model.token_eos(),) if t >= 0
        }
        # Markers the output reader looks for in generated text (thinking, tool calls).
        # Tokens are decoded with special=False, which drops control tokens; a marker the
        # vocabulary holds as one control token is therefore decoded as its text instead.
        self._text_marker_ids = (
            frozenset(
                t
                for t in self._single_tokens(self.profile.text_markers)
                if not self._model.detokenize([t], special=False)
            )
            - self._stop_ids
        )
        self._worker_error: str | None = None
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

    def _single_tokens(self, markers: Sequence[str]) -> frozenset[int]:
        """The ids of markers the vocabulary holds as one token."""
        ids = set()
        for marker in markers:
            toks = self._text_tokens(marker)
            if len(toks) == 1:
                ids.add(toks[0])
        return frozenset(ids)

    def _is_stop(self, token: int) -> bool:
        return token in self._stop_ids or bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def check_schema(self, schema: dict[str, Any]) -> None:
        check_schema_for_grammar(schema)

    def render_prompt(self, messages: Sequence[ChatMessage], **kwargs: Any) -> str:
        """The chat template's rendering of `messages` (what `prepare` tokenizes)."""
        return self.prompter.render(messages, **kwargs)

    def prompt_of(self, tokens: list[int], images: Sequence[Image] = ()) -> Prompt:
        """A ready `Prompt` from token ids `tokenize` made (benchmarks, engine tests)."""
        return Prompt(PromptRequest([]), [], len(tokens), tokens=list(tokens), images=list(images))

    async def prepare(self, request: PromptRequest) -> Prompt:
        return await asyncio.to_thread(self.build_prompt, request)

    def build_prompt(self, request: PromptRequest) -> Prompt:
        """`prepare`, synchronously: render, fit, and compile the constraint to GBNF."""
        prompt = self.prompter.build(request)
        constraint = request.constraint
        if constraint is not None:
            grammar = compile_constraint(
                constraint,
                self.profile.tool_format,
                reasoning=self.profile.reasoning,
                reasoning_open=prompt.reasoning_open,
                effort=request.reasoning_effort,
            )
            # llama.cpp returns NULL for a grammar it cannot parse; sampling with NULL would
            # crash the process, so every grammar is parsed here first.
            try:
                GrammarCheckedSampler(None, self._vocab, grammar, 0).close()
            except ValueError as exc:
                target = "answer" if constraint.answer is not None else "calls"
                raise ConstraintError(
                    f"the schema cannot be enforced by the grammar sampler: {exc}", target
                ) from exc
            prompt.compiled = grammar
        return prompt

    def tokenize(self, prompt: str, images: Sequence[Image] = ()) -> list[int]:
        if not images:
            return self._text_tokens(prompt)
        if self._projector is None:
            raise ValueError(f"the model '{self.model_id}' has no image input")
        parts = prompt.split(self.profile.media_marker)
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
            return replace(
                self._stats,
                running=running,
                queued=len(self._pending),
                healthy=self._worker_error is None,
                problem=self._worker_error,
            )

    # -- admission ------------------------------------------------------------------------

    def generate(
        self, prompt: Prompt, params: SamplingParams, *, cache_key: str | None = None
    ) -> GenerationStream:
        """Admit a request now (raising `EngineBusy` when slots and queue are full) and
        return its event stream; closing the stream cancels the request."""
        spans = self._image_spans(prompt.tokens, prompt.images)
        job = _Job(
            list(prompt.tokens),
            params,
            prompt.compiled,
            cache_key,
            asyncio.get_running_loop(),
            asyncio.Queue(),
            images=spans,
        )
        with self._lock:
            if self._closing:
                raise EngineBusy("the engine is shutting down")
            if self._worker_error is not None:
                raise EngineBusy(f"the engine stopped: {self._worker_error}")
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
        try:
            self._loop()
        except BaseException as exc:  # the worker is gone: nothing may wait on it forever
            log.exception("the decode worker stopped")
            with self._lock:
                self._worker_error = f"{type(exc).__name__}: {exc}"
                jobs = [s.job for s in self._slots if s.job is not None] + list(self._pending)
                self._pending.clear()
                for job in jobs:
                    self._finish(job, "error", error=self._worker_error, locked=True)

    def _loop(self) -> None:
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
        """Move queued jobs into free slots (called with the lock held). A job whose setup
        fails (its sampler cannot be built, ...) fails alone."""
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
            job.emit(Admitted())
            room = self.context_window - len(job.prompt)
            job.limit = room if job.params.max_tokens is None else min(job.params.max_tokens, room)
            try:
                job.sampler = self._make_sampler(job.params)
                if job.grammar_text is not None:
                    job.grammar = GrammarCheckedSampler(
                        job.sampler, self._vocab, job.grammar_text, self._model.n_vocab()
                    )
            except Exception as exc:
                log.exception("a request's sampler could not be built")
                self._finish(job, "error", error=str(exc), locked=True)

    def _make_sampler(self, p: SamplingParams) -> ctypes.c_void_p:
        d = self.default_sampling
        temperature = d["temperature"] if p.temperature is None else p.temperature
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        try:
            add = llama_cpp.llama_sampler_chain_add
            repeat = d.get("repeat_penalty", 1.0) if p.repeat_penalty is None else p.repeat_penalty
            if p.presence_penalty or p.frequency_penalty or repeat != 1.0:
                add(
                    chain,
                    llama_cpp.llama_sampler_init_penalties(
                        self._model.n_vocab(),
                        PENALTY_LAST_N,
                        repeat,
                        p.frequency_penalty,
                        p.presence_penalty,
                    ),
                )
            if temperature <= 0:
                add(chain, llama_cpp.llama_sampler_init_greedy())
            else:
                seed = p.seed if p.seed is not None else random.getrandbits(32)
                top_k = int(d["top_k"] if p.top_k is None else p.top_k)
                top_p = d["top_p"] if p.top_p is None else p.top_p
                min_p = d["min_p"] if p.min_p is None else p.min_p
                add(chain, llama_cpp.llama_sampler_init_top_k(top_k))
                add(chain, llama_cpp.llama_sampler_init_top_p(top_p, 1))
                add(chain, llama_cpp.llama_sampler_init_min_p(min_p, 1))
                add(chain, llama_cpp.llama_sampler_init_temp(temperature))
                add(chain, llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        except BaseException:
            llama_cpp.llama_sampler_free(chain)
            raise
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
        elif reason == "error":
            self._stats.failed += 1
        else:
            self._stats.completed += 1
        if job.slot is not None:  # it ran: count its prompt and what the cache saved
            self._stats.prompt_tokens += len(job.prompt)
            self._stats.cached_tokens += job.cached
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
