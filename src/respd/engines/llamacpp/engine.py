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
the shared batch as usual and, between steps, decodes an image chunk's embeddings into that
sequence alone (at most one image per step). The embeddings come from the projector's
encoder thread, asked for when the job takes its slot: a job whose image is still encoding
sits out the steps meanwhile while the others go on, and the decode context gives up the
encoder's threads (`image_threads`) so the two do not fight over cores. With
`image_encode="inline"` the worker encodes between steps itself, holding every sequence up.

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
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import llama_cpp
from llama_cpp import _internals as internals
from llama_cpp._logger import set_verbose as set_llama_verbose

from respd.engines import defaults
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
from respd.engines.defaults import ImageEncode
from respd.engines.families.profile import detect_profile
from respd.engines.llamacpp.grammar import check_schema_for_grammar, compile_constraint
from respd.engines.llamacpp.kvtier import MIN_SAVE_TOKENS, KVTier, TierMatch, model_identity
from respd.engines.llamacpp.logprobs import LogprobReader
from respd.engines.llamacpp.multimodal import ImageChunk, Projector, ProjectorError
from respd.engines.llamacpp.outbox import Batch, EventBuffer, Outbox
from respd.engines.llamacpp.pages import released_zero_pages
from respd.engines.llamacpp.sampler import GrammarCheckedSampler, logit_bias, token_block
from respd.engines.llamacpp.slots import Slot, common_prefix, place
from respd.engines.llamacpp.speculation import NgramLookup, NgramSpeculation
from respd.engines.prompting import MEDIA_MARKER, TemplatePrompter

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
    out: asyncio.Queue[Batch]
    outbox: Outbox  # the engine's: holds this job's events until the step ends
    # Image chunks of the prompt: (start position, chunk), in order.
    images: list[tuple[int, ImageChunk]] = field(default_factory=list)
    # Their embeddings on the encoder thread's way (background encoding; set at admission).
    encodes: dict[ImageChunk, Future[Any]] = field(default_factory=dict)
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
    # The sampler chain starts with a block on end-of-generation tokens (`ignore_eos`,
    # `min_tokens`); for `min_tokens` it comes off once that many tokens are out.
    eog_blocked: bool = False
    # Prompt-lookup speculation: the history's n-gram index (built at the first draft) and
    # the draft decoded after `next_token` this step, which the samples then verify.
    lookup: NgramLookup | None = None
    draft: list[int] = field(default_factory=list)
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )

    def emit(self, event: GenerationEvent) -> None:
        self.outbox.put(self, event)

    def spans(self) -> list[tuple[int, int]]:
        return [(start, chunk.n_tokens) for start, chunk in self.images]

    @cached_property
    def _image_shift(self) -> int:
        return sum(chunk.n_tokens - chunk.n_pos for _, chunk in self.images)

    def position(self, index: int) -> int:
        """The KV position of the token at `index` of the sequence (prompt, then output).

        It is the index itself, except after an image on an M-RoPE model, whose tokens
        take fewer positions than tokens (`ImageChunk.n_pos`). Reused prefixes never end
        inside an image, so `index` is never inside one either."""
        if not self._image_shift:
            return index
        if index >= len(self.prompt):
            return index - self._image_shift
        return index - sum(
            chunk.n_tokens - chunk.n_pos
            for start, chunk in self.images
            if start + chunk.n_tokens <= index
        )

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
        self._events = EventBuffer(job.out)
        self._release = release
        self._done = False

    def __aiter__(self) -> _JobStream:
        return self

    def cancel(self) -> None:
        self._release(self._job)

    async def __anext__(self) -> GenerationEvent:
        if self._done:
            raise StopAsyncIteration
        event = await self._events.next()
        if isinstance(event, GenerationDone):
            self._done = True
        return event

    async def aclose(self) -> None:
        self._done = True
        self._release(self._job)

    def __del__(self) -> None:
        # Through `release`, which also wakes a worker that waits with nothing to step (every
        # job waiting for an image encode): a dropped job then ends now, not after its encode.
        # The engine's lock is reentrant, so this is safe on the worker thread too.
        self._release(self._job)


class LlamaCppEngine:
    """A GGUF model loaded in-process, serving up to `parallel` sequences at once."""

    def __init__(
        self,
        model_path: Path,
        *,
        model_id: str,
        n_ctx: int = defaults.CTX_SIZE,
        n_threads: int = 2,
        n_batch: int = defaults.BATCH_SIZE,
        parallel: int = defaults.PARALLEL,
        max_queue: int = defaults.MAX_QUEUE,
        chat_template: str | None = None,
        repack: bool | None = None,
        mmproj: Path | None = None,
        sampling: dict[str, float] | None = None,
        speculation: NgramSpeculation | None = None,
        kv_cache_ram_bytes: int = 0,
        kv_cache_dir: Path | None = None,
        kv_cache_disk_bytes: int = 0,
        image_encode: ImageEncode = defaults.IMAGE_ENCODE,
        image_threads: int = defaults.IMAGE_THREADS,
    ) -> None:
        """`sampling`: defaults for requests that set none, over the GGUF's own.
        `speculation`: draft tokens by prompt lookup (None: decode one token at a time).
        `kv_cache_*`: tiers that keep a slot's KV sequence after the slot is reused (see
        `kvtier.py`); all zero: none.
        `image_encode`: where images are encoded: on the projector's encoder thread with
        `image_threads` threads (decoding keeps `n_threads - image_threads` meanwhile), or
        inline on the worker between steps with `n_threads`."""
        self.model_id = model_id
        self.model_path = model_path
        self.vision = False
        self.parallel = parallel
        self.max_queue = max_queue
        self.speculation = speculation
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
        self.n_vocab: int | None = self._model.n_vocab()
        # Every generating sequence puts at least one token in each step's batch.
        self._n_batch = max(parallel, min(n_batch, n_ctx))
        if self._n_batch != n_batch:
            log.info(
                "batch size %d (a step holds a token of each of %d slots, within the context)",
                self._n_batch,
                parallel,
            )
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx * parallel  # every sequence may use its full window
        cparams.n_batch = self._n_batch
        cparams.n_ubatch = self._n_batch
        cparams.n_seq_max = parallel
        # One KV stream per sequence: attention then spans only that sequence's own cells,
        # not every prefix the other slots keep cached. Sharing a prefix across slots
        # copies its cells (see `_copy_sequence`).
        cparams.kv_unified = False
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        cparams.no_perf = True
        try:
            self._kv_tier = self._open_kv_tier(
                cparams, kv_cache_ram_bytes, kv_cache_dir, kv_cache_disk_bytes
            )
        except OSError:
            self._model.close()
            raise
        with released_zero_pages() as released:
            self._ctx = internals.LlamaContext(model=self._model, params=cparams, verbose=False)
        log.info("released %.0f MiB of zeroed KV cache pages", released["bytes"] / 2**20)
        self._mem = llama_cpp.llama_get_memory(self._ctx.ctx)
        self._batch = llama_cpp.llama_batch_init(self._n_batch, 0, 1)
        self._vocab = self._model.vocab
        self._projector: Projector | None = None
        if mmproj is not None:
            try:
                self._projector = Projector(
                    mmproj,
                    self._model,
                    n_threads=image_threads if image_encode == "background" else n_threads,
                    n_batch=self._n_batch,
                    marker=MEDIA_MARKER,
                )
            except ProjectorError:
                self._release_native()
                raise
            self.vision = True
        meta = self._model.metadata()
        source = chat_template or meta.get("tokenizer.chat_template") or FALLBACK_TEMPLATE
        self.profile = detect_profile(source)
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
        self._outbox = Outbox()  # events of the current step (worker thread only)
        self._slots = [Slot(i) for i in range(parallel)]
        self._pending: deque[_Job] = deque()
        self._admitted = 0  # jobs accepted and not yet finished (running + queued)
        self._lock = threading.Condition()
        self._closing = False
        self._step = 0
        self._stats = EngineStats()
        self._image_encode = image_encode
        self._n_threads = n_threads
        self._image_threads = image_threads
        self._threads_now = n_threads  # the decode context's, while encodes run fewer
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

    @cached_property
    def _eog_ids(self) -> frozenset[int]:
        """Every token `_is_stop` ends on. llama.cpp lists its end-of-generation tokens
        only one id at a time, so the vocabulary is walked once, on first need."""
        return self._stop_ids | {
            t for t in range(self._model.n_vocab()) if llama_cpp.llama_vocab_is_eog(self._vocab, t)
        }

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
        parts = prompt.split(MEDIA_MARKER)
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
            tier = self._kv_tier.stats() if self._kv_tier is not None else None
            return replace(
                self._stats,
                running=running,
                queued=len(self._pending),
                healthy=self._worker_error is None,
                problem=self._worker_error,
                details={
                    **self._stats.details,
                    "kv_cache_ram_bytes": tier.ram_bytes if tier else 0,
                    "kv_cache_disk_bytes": tier.disk_bytes if tier else 0,
                    "images_tokenized": self._projector.tokenized if self._projector else 0,
                    "image_chunks_encoded": self._projector.encoded if self._projector else 0,
                },
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
            outbox=self._outbox,
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
            self._wake()

    def _wake(self) -> None:
        """Wake the worker should it wait (a job to cancel, an image encoded)."""
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
            self._outbox.flush()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._closing and self._idle():
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
                    slot.tokens = []  # the cache is cleared below: no slot holds a prefix
                # Cells only: clearing the data too would make the whole buffer resident.
                llama_cpp.llama_memory_clear(self._mem, False)
            # One hand-over per step: admissions, tokens and endings of every sequence.
            self._outbox.flush()

    def _idle(self) -> bool:
        """Whether the worker has nothing to do (called with the lock held): no queued job
        it could admit or end, and every running job waits for an image still encoding.
        Whatever changes that wakes it: a new job, a cancel, an encode's end, closing."""
        if self._pending and (self._pending[0].cancel.is_set() or any(s.free for s in self._slots)):
            return False
        return all(s.job is None or self._waits_for_encode(s.job) for s in self._slots)

    def _waits_for_encode(self, job: _Job) -> bool:
        """Whether the job's next prompt part is an image whose encode has not ended."""
        if job.cancel.is_set():
            return False
        chunk = job.image_at(job.fed)
        future = job.encodes.get(chunk) if chunk is not None else None
        return future is not None and not future.done()

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
            reuse, copy_from = placement.reuse, placement.copy_from
            if self._kv_tier is not None:
                reuse, copy_from = self._use_kv_tier(job, slot, reuse, copy_from)
            if copy_from is not None and not self._copy_sequence(copy_from, slot):
                reuse = 0  # the slot's own cells went first
            llama_cpp.llama_memory_seq_rm(self._mem, seq, job.position(reuse), -1)
            slot.tokens = job.prompt[:reuse]
            slot.prompt_len = len(job.prompt)
            slot.job = job
            slot.cache_key = job.cache_key
            job.slot = slot
            job.cached = reuse
            job.fed = reuse
            job.emit(Admitted())
            room = self.context_window - len(job.prompt)
            job.limit = room if job.params.max_tokens is None else min(job.params.max_tokens, room)
            try:
                # A grammar decides where its output ends (a finished JSON value allows
                # nothing but the end), so with one the block could leave nothing to sample.
                job.eog_blocked = job.grammar_text is None and (
                    job.params.ignore_eos or job.params.min_tokens > 0
                )
                job.sampler = self._make_sampler(job.params, block_eog=job.eog_blocked)
                if job.grammar_text is not None:
                    job.grammar = GrammarCheckedSampler(
                        job.sampler, self._vocab, job.grammar_text, self._model.n_vocab()
                    )
            except Exception as exc:
                log.exception("a request's sampler could not be built")
                self._finish(job, "error", error=str(exc), locked=True)
                continue
            self._encode_images(job)

    def _encode_images(self, job: _Job) -> None:
        """Queue the encodes of the job's images past its reused prefix, in prompt order.

        Asked for at admission rather than in `generate`: only now is it known which images
        the reused prefix holds already (those need no encode), only jobs holding a slot keep
        embeddings alive (a long queue of image requests would otherwise hold all of theirs
        at once), and a request cancelled while queued costs no encode. The encode still
        overlaps the job's own text before the image and every other sequence's steps."""
        if self._image_encode != "background" or self._projector is None:
            return
        for start, chunk in job.images:
            if start >= job.fed and chunk not in job.encodes:
                job.encodes[chunk] = self._projector.encode_later(chunk, self._wake)

    # -- KV tiers: a slot's sequence outlives the slot ------------------------------------

    def _open_kv_tier(
        self, cparams: Any, ram_bytes: int, disk_dir: Path | None, disk_bytes: int
    ) -> KVTier | None:
        if ram_bytes <= 0 and (disk_dir is None or disk_bytes <= 0):
            return None
        # A saved state is valid only for the same model and the same context layout
        # (llama.cpp refuses one saved with another number of sequences, for instance).
        identity = model_identity(
            self.model_path,
            n_ctx=cparams.n_ctx,
            n_seq_max=cparams.n_seq_max,
            kv_unified=cparams.kv_unified,
            type_k=cparams.type_k,
            type_v=cparams.type_v,
            flash_attn=cparams.flash_attn_type,
            state_version=llama_cpp.LLAMA_STATE_SEQ_VERSION,
            llama_cpp=llama_cpp.__version__,
        )
        return KVTier(identity, ram_bytes=ram_bytes, disk_dir=disk_dir, disk_bytes=disk_bytes)

    def _sequence_state(self, seq: int) -> tuple[ctypes.Array[ctypes.c_uint8], int] | None:
        """`seq`'s KV cells serialised by llama.cpp: (buffer, bytes used), or None."""
        size = llama_cpp.llama_state_seq_get_size(self._ctx.ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        n = llama_cpp.llama_state_seq_get_data(self._ctx.ctx, buf, size, seq)
        return (buf, n) if n else None

    def _copy_sequence(self, src: Slot, dst: Slot) -> bool:
        """Put a copy of `src`'s KV cells in `dst`'s sequence, whose old cells go first.

        Through the sequence state rather than `llama_memory_seq_cp`: across KV streams
        that copies the whole stream buffer, at the cost of the context size and making
        every page of the target stream resident; the state holds only the cells in use.
        The caller then drops what follows the shared prefix."""
        llama_cpp.llama_memory_seq_rm(self._mem, dst.seq_id, -1, -1)
        dst.tokens = []
        state = self._sequence_state(src.seq_id)
        if state is not None and llama_cpp.llama_state_seq_set_data(
            self._ctx.ctx, state[0], state[1], dst.seq_id
        ):
            return True
        log.warning("copying a KV sequence between slots failed; the prefix is decoded again")
        llama_cpp.llama_memory_seq_rm(self._mem, dst.seq_id, -1, -1)
        return False

    def _use_kv_tier(
        self, job: _Job, slot: Slot, reuse: int, copy_from: Slot | None
    ) -> tuple[int, Slot | None]:
        """Before `slot` takes `job`: save the slot's sequence when the placement would lose
        a long part of it that nothing else holds, then restore a saved prefix of the
        prompt when it is longer than any slot offers. Returns the placement's (reuse,
        copy_from) after that."""
        tier = self._kv_tier
        assert tier is not None
        match = None
        if not job.images:  # prompts with images skip the tiers: simpler, and rarely long
            limit = max(len(job.prompt) - 1, 0)
            match = tier.find(job.prompt, limit, have=reuse, cache_key=job.cache_key)
        kept = min(common_prefix(slot.tokens, job.prompt), reuse if match is None else match.reuse)
        self._save_sequence(slot, kept)
        if match is None:
            return reuse, copy_from
        if self._restore_sequence(slot, match):
            self._stats.add("kv_restored_tokens", match.reuse)
            return match.reuse, None
        if copy_from is None:
            reuse = min(reuse, len(slot.tokens))  # a failed restore has emptied the slot
        return reuse, copy_from

    def _save_sequence(self, slot: Slot, kept: int, *, slots_stay: bool = True) -> bool:
        """Put `slot`'s KV sequence in the tier, unless what would be lost past the `kept`
        tokens is short, or held by the tier already or (while `slots_stay`) another slot."""
        tier = self._kv_tier
        assert tier is not None
        tokens = slot.tokens
        if len(tokens) - kept < MIN_SAVE_TOKENS or min(tokens) < 0:
            return False  # too little to lose, or image positions (no lookup uses them)
        others = [s for s in self._slots if s is not slot] if slots_stay else []
        elsewhere = max((common_prefix(tokens, s.tokens) for s in others), default=0)
        if len(tokens) - max(kept, elsewhere, tier.covers(tokens)) < MIN_SAVE_TOKENS:
            return False
        seq = slot.seq_id
        # The sequence must hold exactly positions 0..n-1, else its state is not `tokens`'.
        held = (
            llama_cpp.llama_memory_seq_pos_min(self._mem, seq),
            llama_cpp.llama_memory_seq_pos_max(self._mem, seq),
        )
        if held != (0, len(tokens) - 1):
            return False
        state = self._sequence_state(seq)
        if state is None:
            return False
        return tier.put(tokens, memoryview(state[0])[: state[1]].tobytes(), slot.cache_key)

    def _restore_sequence(self, slot: Slot, match: TierMatch) -> bool:
        """Load `match`'s saved state into `slot`'s sequence (its old cells go first); on
        False the slot is as it was, or empty when llama.cpp refused the state."""
        tier = self._kv_tier
        assert tier is not None
        state = tier.load(match)
        if state is None:
            return False
        seq = slot.seq_id
        llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)
        slot.tokens = []
        # A pointer into `state` itself (no copy of what may be hundreds of MB).
        src = ctypes.cast(ctypes.c_char_p(state), ctypes.POINTER(ctypes.c_uint8))
        if llama_cpp.llama_state_seq_set_data(self._ctx.ctx, src, len(state), seq) == 0:
            log.warning("llama.cpp refused a saved KV state; it is dropped")
            llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)
            tier.discard(match.id)
            return False
        slot.tokens = list(match.tokens)
        return True

    def _make_sampler(self, p: SamplingParams, *, block_eog: bool = False) -> ctypes.c_void_p:
        d = self.default_sampling
        temperature = d["temperature"] if p.temperature is None else p.temperature
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        try:
            add = llama_cpp.llama_sampler_chain_add
            if block_eog:  # first, where `_lift_eog_block` finds it
                add(chain, token_block(self._model.n_vocab(), self._eog_ids))
            if p.logit_bias:
                add(chain, logit_bias(self._model.n_vocab(), p.logit_bias))
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
        """Decode one batch: a token per generating sequence (and its draft, if any) plus
        prompt chunks."""
        batch = self._batch
        n = 0
        sample_at: list[tuple[_Job, int]] = []
        running = [s.job for s in self._slots if s.job is not None]
        for job in running:
            if job.cancel.is_set():
                self._finish(job, "cancelled")
        running = [s.job for s in self._slots if s.job is not None]
        if self._projector is not None and self._image_encode == "background":
            self._share_cores(self._projector.encoding)
        # Between steps (the last step's logits are sampled already): at most one image
        # chunk, decoded into its own sequence alone. A job whose image is still encoding
        # sits this step out.
        for job in running:
            chunk = job.image_at(job.fed)
            if chunk is not None and not self._waits_for_encode(job):
                self._feed_image(job, chunk)
                break
        running = [s.job for s in self._slots if s.job is not None]
        # Generating sequences first: each needs one position this step, and a draft as
        # many more as it holds (one position is kept for each sequence still to come).
        generating = [job for job in running if job.next_token is not None]
        for k, job in enumerate(generating):
            assert job.slot is not None and job.next_token is not None
            slot = job.slot
            self._batch_add(n, job.next_token, job.position(len(slot.tokens)), slot.seq_id, True)
            slot.tokens.append(job.next_token)
            job.next_token = None
            sample_at.append((job, n))
            n += 1
            job.draft = self._draft(job, self._n_batch - n - (len(generating) - k - 1))
            for token in job.draft:
                self._batch_add(n, token, job.position(len(slot.tokens)), slot.seq_id, True)
                slot.tokens.append(token)
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
                at = job.fed + i
                last = at == len(job.prompt) - 1
                self._batch_add(n, job.prompt[at], job.position(at), job.slot.seq_id, last)
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
            if job.draft:
                self._verify(job, idx)
            else:
                self._sample(job, idx)

    def _draft(self, job: _Job, room: int) -> list[int]:
        """A prompt-lookup draft to decode after the token just put in the batch: at most
        `room` tokens, and none the job could not use (past its limit or its context)."""
        if self.speculation is None:
            return []
        slot = job.slot
        assert slot is not None
        # Each draft token is worth decoding only if the sample read after it may still be
        # output; `limit` also keeps the draft inside the context window.
        room = min(room, job.limit - job.produced - 1)
        if room <= 0:
            return []
        if job.lookup is None:
            job.lookup = NgramLookup(self.speculation)
        # The history is what the sequence holds: prompt and output up to `next_token`
        # (rejected drafts are trimmed off it before the next step).
        job.lookup.extend(slot.tokens[len(job.lookup) :])
        return job.lookup.propose(room)

    def _verify(self, job: _Job, idx: int) -> None:
        """Sample `job` at `idx` (its `next_token`) and on through its draft while each
        sample equals the draft token decoded at that position; the cache cells of the
        draft past the first mismatch are dropped.

        Each token is still the sampler's own choice from logits of the true history (the
        draft is fixed in advance, so comparing after sampling biases nothing): the output
        follows the same distribution as without a draft, for any sampler or grammar, and
        greedy output is the same tokens. A draft only saves the decodes it got right."""
        slot = job.slot
        assert slot is not None
        draft, job.draft = job.draft, []
        accepted = 0
        self._sample(job, idx)
        while accepted < len(draft) and job.next_token == draft[accepted]:
            job.next_token = None  # already decoded, as part of the draft
            accepted += 1
            self._sample(job, idx + accepted)
        self._stats.add("draft_tokens", len(draft))
        self._stats.add("draft_accepted", accepted)
        if job.lookup is not None:
            job.lookup.feedback(len(draft), accepted)
        keep = len(slot.tokens) - (len(draft) - accepted)
        if keep < len(slot.tokens):
            llama_cpp.llama_memory_seq_rm(self._mem, slot.seq_id, job.position(keep), -1)
            del slot.tokens[keep:]

    def _share_cores(self, encoding: bool) -> None:
        """Decode with `image_threads` fewer threads while the encoder thread runs: ggml's
        spinning thread barriers degrade badly when the two oversubscribe the cores."""
        n = max(1, self._n_threads - self._image_threads) if encoding else self._n_threads
        if n != self._threads_now:
            llama_cpp.llama_set_n_threads(self._ctx.ctx, n, n)
            self._threads_now = n

    def _feed_image(self, job: _Job, chunk: ImageChunk) -> None:
        """Decode an image chunk's embeddings (encoded in the background, or now inline
        unless cached) into the job's sequence; a failure fails this job only."""
        assert job.slot is not None and self._projector is not None
        slot = job.slot
        future = job.encodes.get(chunk)
        try:
            if future is None:
                embd = self._projector.embeddings(chunk)
            elif future.cancelled():
                raise RuntimeError("image encoding was cancelled: the engine is shutting down")
            else:
                embd = future.result()
            self._projector.decode(self._ctx.ctx, chunk, embd, job.position(job.fed), slot.seq_id)
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
        self._lift_eog_block(job)
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

    def _lift_eog_block(self, job: _Job) -> None:
        """With `min_tokens` produced (and no `ignore_eos`), the model may end again: the
        block comes out of the chain, leaving the other samplers' state as it was."""
        if job.eog_blocked and not job.params.ignore_eos and job.produced >= job.params.min_tokens:
            llama_cpp.llama_sampler_free(llama_cpp.llama_sampler_chain_remove(job.sampler, 0))
            job.eog_blocked = False

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
        if self._kv_tier is not None:
            # With a disk tier, what the slots hold survives the restart too (only once
            # the worker is gone: it alone may touch the context).
            if self._kv_tier.persistent and not self._worker.is_alive():
                # Longest first: a slot holding a prefix of a saved one is then covered.
                for slot in sorted(self._slots, key=lambda s: -len(s.tokens)):
                    self._save_sequence(slot, 0, slots_stay=False)
            self._kv_tier.close()
        self._release_native()

    def _release_native(self) -> None:
        if self._projector is not None:
            self._projector.close()
            self._projector = None
        llama_cpp.llama_batch_free(self._batch)
        self._ctx.close()
        self._model.close()
