"""The decode worker: the thread that runs every step of the engine's continuous batching.

Each step it admits queued jobs into free slots, decodes at most one image chunk, then one
batch holding a token (and any draft) of each generating sequence plus prompt chunks in the
room left, and samples each sequence with its own chain. It alone touches the llama.cpp
context; admission and `stats()` share its queue and slots under its lock.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections import deque
from functools import cached_property
from typing import Any

import llama_cpp
from llama_cpp import _internals as internals

from respd.engines.base import (
    Admitted,
    EngineBusy,
    EngineStats,
    FinishReason,
    GenerationDone,
    SamplingParams,
    TokenChunk,
)
from respd.engines.defaults import ImageEncode, JumpForward
from respd.engines.llamacpp.closing import Closer, ClosingVocab
from respd.engines.llamacpp.jobs import Job
from respd.engines.llamacpp.jumpforward import ForcedText, JumpForwardPolicy
from respd.engines.llamacpp.logprobs import LogprobReader
from respd.engines.llamacpp.multimodal import ImageChunk, Projector
from respd.engines.llamacpp.outbox import Outbox
from respd.engines.llamacpp.sampler import (
    ChainContext,
    GrammarCheckedSampler,
    chain_top,
    sampler_chain,
)
from respd.engines.llamacpp.sequences import KvSequences
from respd.engines.llamacpp.slots import Slot, place
from respd.engines.llamacpp.speculation import NgramLookup, NgramSpeculation

# The process's decode thread budget, shared by every model loaded: models generating at
# once take turns batch by batch, each with all its --threads, instead of running their
# thread pools side by side on the same cores (uncontended with one model).
DECODE_TURNS = threading.Lock()

log = logging.getLogger(__name__)


class DecodeWorker:
    """The decode loop over `ctx`'s `parallel` sequences, and the queue that feeds it."""

    def __init__(
        self,
        model: internals.LlamaModel,
        ctx: internals.LlamaContext,
        batch: Any,  # a llama_batch of `n_batch` tokens
        *,
        projector: Projector | None,
        sequences: KvSequences,
        slots: list[Slot],
        pending: deque[Job],
        lock: threading.Condition,
        stats: EngineStats,
        parallel: int,
        max_queue: int,
        context_window: int,
        n_batch: int,
        speculation: NgramSpeculation | None,
        jump_forward: JumpForward,
        chain: ChainContext,
        stop_ids: frozenset[int],
        text_marker_ids: frozenset[int],
        image_encode: ImageEncode,
        n_threads: int,
        image_threads: int,
    ) -> None:
        """`slots`, `pending` (the queue), `lock` and `stats` are the engine's, shared with
        admission and `stats()`. `stop_ids`: tokens that end generation besides llama.cpp's
        end-of-generation ones; `text_marker_ids`: control tokens decoded as their text."""
        self._model = model
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx.ctx)
        self._batch = batch
        self._vocab = model.vocab
        self._projector = projector
        self.parallel = parallel
        self.max_queue = max_queue
        self.context_window = context_window
        self._n_batch = n_batch
        self.speculation = speculation
        self._to_measure: Job | None = None  # admitted, for `auto` to measure with
        self.jump = JumpForwardPolicy(jump_forward, stats, context_window, n_batch, DECODE_TURNS)
        self._chain = chain
        self._stop_ids = stop_ids
        self._text_marker_ids = text_marker_ids
        self.error: str | None = None  # why the worker stopped, if it did
        self.outbox = Outbox()  # events of the current step (worker thread only)
        self._slots = slots
        self._pending = pending
        self._admitted = 0  # jobs accepted and not yet finished (running + queued)
        self._lock = lock
        self._closing = False
        self._step = 0
        self._stats = stats
        self._sequences = sequences
        self._image_encode = image_encode
        self._n_threads = n_threads
        self._image_threads = image_threads
        self._threads_now = n_threads  # the decode context's, while encodes run fewer
        self._thread = threading.Thread(target=self._work, name="llamacpp-batch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def admit(self, job: Job) -> None:
        """Queue `job` for a slot, raising `EngineBusy` when slots and queue are full."""
        with self._lock:
            if self._closing:
                raise EngineBusy("the engine is shutting down")
            if self.error is not None:
                raise EngineBusy(f"the engine stopped: {self.error}")
            if self._admitted >= self.parallel + self.max_queue:
                raise EngineBusy(
                    f"all {self.parallel} slots are busy and {len(self._pending)} requests "
                    "are queued"
                )
            self._admitted += 1
            self._pending.append(job)
            self._lock.notify()

    def release(self, job: Job) -> None:
        if not job.cancel.is_set():
            job.cancel.set()
            self.wake()

    def wake(self) -> None:
        """Wake the worker should it wait (a job to cancel, an image encoded)."""
        with self._lock:
            self._lock.notify()

    def stop(self) -> None:
        """End the loop and wait a while for the thread to go."""
        with self._lock:
            self._closing = True
            self._lock.notify()
        self._thread.join(timeout=5)

    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- the decode loop ------------------------------------------------------------------

    def _work(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # the worker is gone: nothing may wait on it forever
            log.exception("the decode worker stopped")
            with self._lock:
                self.error = f"{type(exc).__name__}: {exc}"
                jobs = [s.job for s in self._slots if s.job is not None] + list(self._pending)
                self._pending.clear()
                for job in jobs:
                    self._finish(job, "error", error=self.error, locked=True)
            self.outbox.flush()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._closing and self._idle():
                    self._lock.wait()
                if self._closing:
                    return
                self._admit_pending()
            if self._to_measure is not None:
                self._measure_batching(self._to_measure)
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
            self.outbox.flush()

    def _idle(self) -> bool:
        """Whether the worker has nothing to do (called with the lock held): no queued job
        it could admit or end, and every running job waits for an image still encoding.
        Whatever changes that wakes it: a new job, a cancel, an encode's end, closing."""
        if self._pending and (self._pending[0].cancel.is_set() or any(s.free for s in self._slots)):
            return False
        return all(s.job is None or self._waits_for_encode(s.job) for s in self._slots)

    def _waits_for_encode(self, job: Job) -> bool:
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
            if self._sequences.tier is not None:
                reuse, copy_from = self._sequences.use_tier(job, slot, reuse, copy_from)
            if copy_from is not None and not self._sequences.copy(copy_from, slot):
                reuse = 0  # the slot's own cells went first
            llama_cpp.llama_memory_seq_rm(self._mem, seq, job.position(reuse), -1)
            slot.tokens = job.prompt[:reuse]
            slot.prompt_len = len(job.prompt)
            slot.job = job
            slot.cache_key = job.cache_key
            slot.retain = job.retain
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
                        job.sampler,
                        self._vocab,
                        job.grammar_text,
                        self._model.n_vocab(),
                        top=chain_top(job.params, self._chain),
                    )
                    if job.closes:
                        job.closer = self._closer(job.grammar_text)
            except Exception as exc:
                log.exception("a request's sampler could not be built")
                self._finish(job, "error", error=str(exc), locked=True)
                continue
            if job.grammar is not None and self.jump.unmeasured:
                self._to_measure = job  # after the lock is let go: admission need not wait
            self._encode_images(job)

    def _measure_batching(self, job: Job) -> None:
        """For `auto` jump-forward: what a batched token costs, measured once in `job`'s
        sequence past its reused prefix (the cells are cleared again), with its first
        prompt token when that is a vocabulary token (an image's is not)."""
        self._to_measure = None
        if job.slot is None:
            return
        token = job.prompt[0] if 0 <= job.prompt[0] < self._model.n_vocab() else 0
        self.jump.measure_once(
            self._ctx.ctx, self._batch, job.slot.seq_id, job.position(job.fed), token
        )

    def _encode_images(self, job: Job) -> None:
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
                job.encodes[chunk] = self._projector.encode_later(chunk, self.wake)

    def _make_sampler(self, p: SamplingParams, *, block_eog: bool = False) -> ctypes.c_void_p:
        block = self._eog_ids if block_eog else None
        return sampler_chain(p, self._chain, block)

    # -- one step --------------------------------------------------------------------------

    def _step_once(self) -> None:
        """Decode one batch: a token per generating sequence (and its draft, if any) plus
        prompt chunks."""
        batch = self._batch
        n = 0
        sample_at: list[tuple[Job, int]] = []
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
        with DECODE_TURNS:  # one model's batch at a time: each uses every decode thread
            rc = llama_cpp.llama_decode(self._ctx.ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        self._step += 1
        for job, idx in sample_at:
            if job.draft:
                self._verify(job, idx)
            else:
                self._sample(job, idx)

    def _draft(self, job: Job, room: int) -> list[int]:
        """A draft to decode after the token just put in the batch: the text the job's
        grammar forces next (jump-forward), else a prompt-lookup guess; at most `room`
        tokens, and none the job could not use (past its limit or its context)."""
        jumps = job.grammar is not None and self.jump.on
        if self.speculation is None and not jumps:
            return []
        slot = job.slot
        assert slot is not None
        # Each draft token is worth decoding only if the sample read after it may still be
        # output; `limit` also keeps the draft inside the context window.
        room = min(room, job.limit - job.produced - 1)
        if room <= 0:
            return []
        if jumps:
            assert job.grammar is not None
            forced = self._forced_text.draft(job.grammar.grammar, job.spacing, room)
            job.jumped = bool(forced)
            if forced or self.speculation is None:
                return forced
        assert self.speculation is not None
        if job.lookup is None:
            job.lookup = NgramLookup(self.speculation)
        # The history is what the sequence holds: prompt and output up to `next_token`
        # (rejected drafts are trimmed off it before the next step).
        job.lookup.extend(slot.tokens[len(job.lookup) :])
        return job.lookup.propose(room)

    def _verify(self, job: Job, idx: int) -> None:
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
        kind = "jump_forward" if job.jumped else "draft"
        job.jumped = False
        self._stats.add(f"{kind}_tokens", len(draft))
        self._stats.add(f"{kind}_accepted", accepted)
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

    def _feed_image(self, job: Job, chunk: ImageChunk) -> None:
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

    def _sample(self, job: Job, idx: int) -> None:
        if job.cancel.is_set():
            self._finish(job, "cancelled")
            return
        if job.limit <= 0:
            self._finish(job, "length")
            return
        left = job.limit - job.produced
        if job.wrap_up and not (job.closer and job.grammar and job.closer.close_now(job.grammar)):
            self._finish(job, "cancelled")  # its output looped and cannot close: cut it
            return
        if job.grammar is not None and job.closer is not None and job.closer.due(job.grammar, left):
            token, forced = job.closer.sample(job.grammar, self._ctx.ctx, idx)
            job.closed_early |= forced
        elif job.grammar is not None:
            token = job.grammar.sample(self._ctx.ctx, idx)
        else:
            token = llama_cpp.llama_sampler_sample(job.sampler, self._ctx.ctx, idx)
        if self._is_stop(token):
            self._finish(job, "length" if job.closed_early else "stop")
            return
        job.produced += 1
        self._lift_eog_block(job)
        self._stats.generated_tokens += 1
        piece = self._model.detokenize([token], special=token in self._text_marker_ids)
        chunk = TokenChunk(job.decoder.decode(piece), [token])
        if job.grammar is not None and self.jump.on:
            job.spacing.learn(chunk.text)
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

    def _lift_eog_block(self, job: Job) -> None:
        """With `min_tokens` produced (and no `ignore_eos`), the model may end again: the
        block comes out of the chain, leaving the other samplers' state as it was."""
        if job.eog_blocked and not job.params.ignore_eos and job.produced >= job.params.min_tokens:
            llama_cpp.llama_sampler_free(llama_cpp.llama_sampler_chain_remove(job.sampler, 0))
            job.eog_blocked = False

    @cached_property
    def _closing_vocab(self) -> ClosingVocab:
        pieces = [self._piece(t) for t in range(self._model.n_vocab())]
        eog = min(t for t in self._eog_ids if llama_cpp.llama_vocab_is_eog(self._vocab, t))
        return ClosingVocab.of(pieces, eog)

    def _closer(self, grammar: str) -> Closer:
        return Closer(self._closing_vocab, grammar, self._text_tokens, self._forced_text)

    @cached_property
    def _forced_text(self) -> ForcedText:
        return ForcedText(self._piece, self._text_tokens, self._model.n_vocab())

    @cached_property
    def _logprob_reader(self) -> LogprobReader:
        return LogprobReader(self._model.n_vocab(), self._piece)

    def _piece(self, token: int) -> bytes:
        """One token's text, as plain text (a special token's is empty)."""
        return bytes(self._model.detokenize([token], special=False))

    def _text_tokens(self, text: str) -> list[int]:
        """Plain text's tokens, no BOS, special-token markup read as text."""
        return list(self._model.tokenize(text.encode(), add_bos=False, special=False))

    def _finish(
        self,
        job: Job,
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

    def _is_stop(self, token: int) -> bool:
        return token in self._stop_ids or bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    @cached_property
    def _eog_ids(self) -> frozenset[int]:
        """Every token `_is_stop` ends on. llama.cpp lists its end-of-generation tokens
        only one id at a time, so the vocabulary is walked once, on first need."""
        return self._stop_ids | {
            t for t in range(self._model.n_vocab()) if llama_cpp.llama_vocab_is_eog(self._vocab, t)
        }
