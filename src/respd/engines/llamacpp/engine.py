"""The default engine: GGUF models through llama.cpp, with continuous batching.

One llama.cpp context holds `parallel` sequences, each in its own KV stream. A worker thread runs
the decode loop: every step it puts one token of each generating sequence, plus a chunk of
any prompt still being prefilled, into a single batch, decodes it, and samples each sequence
with its own sampler chain. New requests join at the next step; a finished or cancelled
sequence frees its slot at once. Prompts reuse the longest prefix any slot holds (see
`slots.py`). The event loop never blocks on a decode: results cross to it through
`call_soon_threadsafe`.

`LlamaCppEngine` (here) loads the model, renders and tokenizes prompts and admits requests;
`worker.py` runs the decode loop over `jobs.py`'s jobs, with each request's sampler chain
from `sampler.py` and the slots' KV sequences copied, saved and restored by `sequences.py`.

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
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import llama_cpp
from llama_cpp import _internals as internals

from respd.engines import defaults
from respd.engines.base import (
    ChatMessage,
    EngineBusy,
    EngineStats,
    GenerationDone,
    GenerationStream,
    Image,
    Prompt,
    PromptRequest,
    SamplingParams,
)
from respd.engines.chat_template import FALLBACK_TEMPLATE, ChatTemplate
from respd.engines.constraints import ConstraintError
from respd.engines.defaults import ImageEncode, JumpForward
from respd.engines.families.profile import detect_profile
from respd.engines.llamacpp.grammar import check_schema_for_grammar, compile_constraint
from respd.engines.llamacpp.jobs import Job, JobStream
from respd.engines.llamacpp.loading import load_model
from respd.engines.llamacpp.multimodal import ImageChunk, Projector, ProjectorError
from respd.engines.llamacpp.pages import released_zero_pages
from respd.engines.llamacpp.sampler import (
    DRY_SEQUENCE_BREAKERS,
    FALLBACK_DRY,
    FALLBACK_SAMPLING,
    ChainContext,
    GrammarCheckedSampler,
    recommended_sampling,
)
from respd.engines.llamacpp.sequences import KvSequences, open_kv_tier
from respd.engines.llamacpp.slots import Slot
from respd.engines.llamacpp.speculation import NgramSpeculation
from respd.engines.llamacpp.worker import DecodeWorker
from respd.engines.prompting import MEDIA_MARKER, TemplatePrompter

log = logging.getLogger(__name__)


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
        dry_sequence_breakers: Sequence[str] | None = None,
        speculation: NgramSpeculation | None = None,
        jump_forward: JumpForward = defaults.JUMP_FORWARD,
        kv_cache_ram_bytes: int = 0,
        kv_cache_dir: Path | None = None,
        kv_cache_disk_bytes: int = 0,
        image_encode: ImageEncode = defaults.IMAGE_ENCODE,
        image_threads: int = defaults.IMAGE_THREADS,
    ) -> None:
        """`sampling`: defaults for requests that set none, over the GGUF's own
        (`dry_sequence_breakers`: DRY's, which is not a number).
        `speculation`: draft tokens by prompt lookup (None: decode one token at a time).
        `jump_forward`: decode the text a request's grammar forces as a draft (auto:
        where a step of several tokens measures cheaper per token than one).
        `kv_cache_*`: tiers that keep a slot's KV sequence after the slot is reused (see
        `kvtier.py`); all zero: none.
        `image_encode`: where images are encoded: on the projector's encoder thread with
        `image_threads` threads (decoding keeps `n_threads - image_threads` meanwhile), or
        inline on the worker between steps with `n_threads`."""
        self.model_id = model_id
        self.model_path = model_path
        # Closing waits for prompts being built; none start once it has begun.
        self._use = threading.Lock()
        self._closed = False
        self._building = 0
        self.vision = False
        self.parallel = parallel
        self.max_queue = max_queue
        self._dry_breakers = dry_sequence_breakers
        self._model = load_model(model_path, repack)
        self.context_window = n_ctx
        self.n_vocab: int | None = self._model.n_vocab()
        self._n_batch = self._batch_size(n_batch, n_ctx, parallel)
        cparams = self._context_params(n_ctx, parallel, n_threads)
        try:
            self._kv_tier = open_kv_tier(
                model_path, cparams, kv_cache_ram_bytes, kv_cache_dir, kv_cache_disk_bytes
            )
        except OSError:
            self._model.close()
            raise
        self._open_context(cparams)
        self._open_projector(mmproj, image_threads if image_encode == "background" else n_threads)
        self._detect_profile(chat_template, sampling, n_ctx)
        self._start_worker(speculation, jump_forward, n_threads, image_encode, image_threads)

    # -- the steps of loading -------------------------------------------------------------

    @staticmethod
    def _batch_size(n_batch: int, n_ctx: int, parallel: int) -> int:
        # Every generating sequence puts at least one token in each step's batch.
        size = max(parallel, min(n_batch, n_ctx))
        if size != n_batch:
            log.info(
                "batch size %d (a step holds a token of each of %d slots, within the context)",
                size,
                parallel,
            )
        return size

    def _context_params(self, n_ctx: int, parallel: int, n_threads: int) -> Any:
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx * parallel  # every sequence may use its full window
        cparams.n_batch = self._n_batch
        cparams.n_ubatch = self._n_batch
        cparams.n_seq_max = parallel
        # One KV stream per sequence: attention then spans only that sequence's own cells,
        # not every prefix the other slots keep cached. Sharing a prefix across slots
        # copies its cells (see `KvSequences.copy`).
        cparams.kv_unified = False
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        cparams.no_perf = True
        return cparams

    def _open_context(self, cparams: Any) -> None:
        with released_zero_pages() as released:
            self._ctx = internals.LlamaContext(model=self._model, params=cparams, verbose=False)
        log.info("released %.0f MiB of zeroed KV cache pages", released["bytes"] / 2**20)
        self._mem = llama_cpp.llama_get_memory(self._ctx.ctx)
        self._batch = llama_cpp.llama_batch_init(self._n_batch, 0, 1)
        self._vocab = self._model.vocab

    def _open_projector(self, mmproj: Path | None, n_threads: int) -> None:
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

    def _detect_profile(
        self, chat_template: str | None, sampling: dict[str, float] | None, n_ctx: int
    ) -> None:
        """The model family's profile, default sampling, prompter and stop tokens."""
        meta = self._model.metadata()
        source = chat_template or meta.get("tokenizer.chat_template") or FALLBACK_TEMPLATE
        self.profile = detect_profile(source)
        # The server's settings over the model authors' sampling over llama-server's
        # defaults; a request's own values override them all.
        self.default_sampling = {
            **FALLBACK_SAMPLING,
            **FALLBACK_DRY,
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

    def _start_worker(
        self,
        speculation: NgramSpeculation | None,
        jump_forward: JumpForward,
        n_threads: int,
        image_encode: ImageEncode,
        image_threads: int,
    ) -> None:
        self._slots = [Slot(i) for i in range(self.parallel)]
        self._pending: deque[Job] = deque()
        # The worker's, shared with admission and `stats()`; reentrant (see `JobStream`).
        self._lock = threading.Condition()
        self._stats = EngineStats()
        self._sequences = KvSequences(self._ctx, self._kv_tier, self._slots, self._stats)
        self._worker = DecodeWorker(
            self._model,
            self._ctx,
            self._batch,
            projector=self._projector,
            sequences=self._sequences,
            slots=self._slots,
            pending=self._pending,
            lock=self._lock,
            stats=self._stats,
            parallel=self.parallel,
            max_queue=self.max_queue,
            context_window=self.context_window,
            n_batch=self._n_batch,
            speculation=speculation,
            jump_forward=jump_forward,
            chain=ChainContext(
                defaults=self.default_sampling,
                n_vocab=self._model.n_vocab(),
                vocab=self._vocab,
                n_ctx=self.context_window,
                dry_breakers=(
                    DRY_SEQUENCE_BREAKERS
                    if self._dry_breakers is None
                    else tuple(self._dry_breakers)
                ),
            ),
            stop_ids=self._stop_ids,
            text_marker_ids=self._text_marker_ids,
            image_encode=image_encode,
            n_threads=n_threads,
            image_threads=image_threads,
        )
        self._worker.start()

    @property
    def speculation(self) -> NgramSpeculation | None:
        """Prompt-lookup drafting (None: off); the worker reads it at each draft, so setting
        it takes effect at the next step."""
        return self._worker.speculation

    @speculation.setter
    def speculation(self, value: NgramSpeculation | None) -> None:
        self._worker.speculation = value

    @property
    def jump_forward(self) -> JumpForward:
        """Whether grammar-forced text is decoded as a draft (read at each draft)."""
        return self._worker.jump.mode

    @jump_forward.setter
    def jump_forward(self, value: JumpForward) -> None:
        self._worker.jump.mode = value

    @property
    def _worker_error(self) -> str | None:
        """Why the worker stopped, if it did (what `stats()` reports)."""
        return self._worker.error

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

    def check_schema(self, schema: dict[str, Any]) -> None:
        check_schema_for_grammar(schema)

    def render_prompt(self, messages: Sequence[ChatMessage], **kwargs: Any) -> str:
        """The chat template's rendering of `messages` (what `prepare` tokenizes)."""
        return self.prompter.render(messages, **kwargs)

    def prompt_of(self, tokens: list[int], images: Sequence[Image] = ()) -> Prompt:
        """A ready `Prompt` from token ids `tokenize` made (benchmarks, engine tests)."""
        return Prompt(PromptRequest([]), [], len(tokens), tokens=list(tokens), images=list(images))

    async def prepare(self, request: PromptRequest) -> Prompt:
        return await asyncio.to_thread(self._guarded_build, request)

    def _guarded_build(self, request: PromptRequest) -> Prompt:
        """`build_prompt`, refused once the engine is closing (a model unloaded between a
        request's lookup and its prompt); `close` waits for those under way."""
        with self._use:
            if self._closed:
                raise EngineBusy(f"the model {self.model_id} was unloaded; retry")
            self._building += 1
        try:
            return self.build_prompt(request)
        finally:
            with self._use:
                self._building -= 1

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
        self,
        prompt: Prompt,
        params: SamplingParams,
        *,
        cache_key: str | None = None,
        retain: bool = False,
    ) -> GenerationStream:
        """Admit a request now (raising `EngineBusy` when slots and queue are full) and
        return its event stream; closing the stream cancels the request. `retain`: the
        slot's KV, once saved to the tiers, goes after every other entry there."""
        if self._closed:
            raise EngineBusy(f"the model {self.model_id} was unloaded; retry")
        spans = self._image_spans(prompt.tokens, prompt.images)
        constraint = prompt.request.constraint
        job = Job(
            list(prompt.tokens),
            params,
            prompt.compiled,
            cache_key,
            asyncio.get_running_loop(),
            asyncio.Queue(),
            outbox=self._worker.outbox,
            images=spans,
            retain=retain,
            # An answer closes before the limit cuts it; a call never does (see closing.py).
            closes=constraint is not None and constraint.calls is None,
        )
        self._worker.admit(job)
        return JobStream(job, self._worker.release)

    async def prewarm(
        self, prompt: Prompt, *, cache_key: str | None = None, retain: bool = False
    ) -> int:
        """Decode `prompt` into a slot (reusing what is cached, as a request would) and
        stop before the first sample: the slot then holds the whole prompt, for the next
        request that starts with it. Returns the prompt tokens that were cached already."""
        # No output, so no grammar to compile into a sampler.
        stream = self.generate(
            replace(prompt, compiled=None),
            SamplingParams(max_tokens=0),
            cache_key=cache_key,
            retain=retain,
        )
        cached = 0
        try:
            async for event in stream:
                if isinstance(event, GenerationDone):
                    if event.finish_reason == "error":
                        raise RuntimeError(f"prewarming the prompt failed: {event.error}")
                    cached = event.cached_tokens
        finally:
            await stream.aclose()
        return cached

    def close(self) -> None:
        with self._use:
            self._closed = True
        while True:  # prompts being built read the model: they finish first (milliseconds)
            with self._use:
                if not self._building:
                    break
            time.sleep(0.005)
        self._worker.stop()
        if self._kv_tier is not None:
            # With a disk tier, what the slots hold survives the restart too (only once
            # the worker is gone: it alone may touch the context).
            if self._kv_tier.persistent and not self._worker.alive():
                # Longest first: a slot holding a prefix of a saved one is then covered.
                for slot in sorted(self._slots, key=lambda s: -len(s.tokens)):
                    self._sequences.save(slot, 0, slots_stay=False)
            self._kv_tier.close()
        self._release_native()

    def _release_native(self) -> None:
        if self._projector is not None:
            self._projector.close()
            self._projector = None
        llama_cpp.llama_batch_free(self._batch)
        self._ctx.close()
        self._model.close()
