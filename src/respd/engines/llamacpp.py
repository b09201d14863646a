"""The default engine: GGUF models through llama-cpp-python, on the CPU.

One llama.cpp context serves requests one at a time from a FIFO queue on a dedicated worker
thread, so the event loop never blocks on a decode. Requests that arrive together are all
served, in arrival order. Closing a generation's iterator (a client went away) sets its
cancel flag, which the worker checks between tokens; a job cancelled while still queued
never starts.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import queue
import random
import threading
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import llama_cpp

from respd.engines import grammar_sampler
from respd.engines.base import (
    ChatMessage,
    EngineStats,
    FinishReason,
    GenerationDone,
    GenerationEvent,
    SamplingParams,
    TokenChunk,
)
from respd.engines.chat_template import FALLBACK_TEMPLATE, ChatTemplate

log = logging.getLogger(__name__)

# Special tokens that end an assistant turn in the common template families; each counts
# as a stop token when the model's vocabulary has it as a single token and its template
# uses it.
_END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


@dataclass
class _Job:
    prompt_tokens: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[GenerationEvent]
    cancel: threading.Event = field(default_factory=threading.Event)

    def emit(self, event: GenerationEvent) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, event)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class LlamaCppEngine:
    """A GGUF model loaded in-process."""

    def __init__(
        self,
        model_path: Path,
        *,
        model_id: str,
        n_ctx: int = 4096,
        n_threads: int = 2,
        n_batch: int = 512,
        chat_template: str | None = None,
        top_k: int = 40,
        min_p: float = 0.05,
    ) -> None:
        self.model_id = model_id
        self.model_path = model_path
        self._llama = llama_cpp.Llama(
            model_path=str(model_path),
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            n_batch=min(n_batch, n_ctx),
            verbose=False,
        )
        self.context_window = self._llama.n_ctx()
        self._top_k = top_k
        self._min_p = min_p
        self._model = self._llama._model
        meta = self._llama.metadata
        source = chat_template or meta.get("tokenizer.chat_template") or FALLBACK_TEMPLATE
        self.template_source = source
        self.template = ChatTemplate(
            source,
            bos_token=self._token_text(self._llama.token_bos()),
            eos_token=self._token_text(self._llama.token_eos()),
        )
        self._stop_ids = self._end_of_turn_ids(source)
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._stats = EngineStats()
        self._worker = threading.Thread(target=self._work, name="llamacpp-worker", daemon=True)
        self._worker.start()

    # -- rendering and tokens -------------------------------------------------------------

    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self._model.token_get_text(token)

    def _end_of_turn_ids(self, template_source: str) -> frozenset[int]:
        ids = {self._llama.token_eos()}
        for marker in _END_OF_TURN_MARKERS:
            if marker not in template_source:
                continue
            toks = self._llama.tokenize(marker.encode(), add_bos=False, special=True)
            if len(toks) == 1:
                ids.add(toks[0])
        return frozenset(t for t in ids if t >= 0)

    def _is_stop(self, token: int) -> bool:
        return token in self._stop_ids or llama_cpp.llama_vocab_is_eog(self._model.vocab, token)

    def render_prompt(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        extra: dict[str, Any] = {"tools": tools} if tools else {}
        return self.template.render(
            [m.as_template_dict() for m in messages],
            add_generation_prompt=add_generation_prompt,
            **extra,
        )

    def check_grammar(self, grammar: str) -> None:
        # llama.cpp returns NULL for a grammar it cannot parse; adding NULL to a sampler
        # chain would crash the process, so every grammar is parsed here first.
        sampler = llama_cpp.llama_sampler_init_grammar(
            self._model.vocab, grammar.encode("utf-8"), b"root"
        )
        if not sampler:
            raise ValueError("the grammar sampler rejected the generated grammar")
        llama_cpp.llama_sampler_free(sampler)

    def tokenize(self, prompt: str) -> list[int]:
        # The rendered template already carries any BOS it wants; special tokens in it
        # (e.g. <|im_start|>) must map to their ids.
        return self._llama.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)

    # -- generation -----------------------------------------------------------------------

    async def generate(
        self, prompt_tokens: list[int], params: SamplingParams
    ) -> AsyncGenerator[GenerationEvent, None]:
        loop = asyncio.get_running_loop()
        job = _Job(list(prompt_tokens), params, loop, asyncio.Queue())
        self._jobs.put(job)
        try:
            while True:
                event = await job.out.get()
                yield event
                if isinstance(event, GenerationDone):
                    return
        finally:
            job.cancel.set()

    def stats(self) -> EngineStats:
        return replace(self._stats, queued=self._jobs.qsize())

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self._stats.running = 1
            try:
                self._run(job)
            except Exception as exc:  # a failed job must not kill the worker
                log.exception("generation failed")
                job.emit(GenerationDone("error", len(job.prompt_tokens), 0, error=str(exc)))
            finally:
                self._stats.running = 0

    def _run(self, job: _Job) -> None:
        llama = self._llama
        prompt = job.prompt_tokens
        if job.cancel.is_set():
            self._stats.cancelled += 1
            job.emit(GenerationDone("cancelled", len(prompt), 0))
            return
        held = list(llama._input_ids[: llama.n_tokens])
        # llama.cpp re-evaluates at least the last prompt token to get fresh logits.
        cached = min(_common_prefix(held, prompt), max(len(prompt) - 1, 0))
        self._prefill_all_but_last(prompt, cached)
        p = job.params
        llama.set_seed(p.seed if p.seed is not None else random.getrandbits(32))
        room = self.context_window - len(prompt)
        limit = room if p.max_tokens is None else min(p.max_tokens, room)
        finish: FinishReason = "length"
        produced = 0
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        grammar_sampler.install(llama, p.grammar)
        if limit > 0:
            for token in llama.generate(
                prompt,
                temp=p.temperature,
                top_p=p.top_p,
                top_k=self._top_k,
                min_p=self._min_p,
                repeat_penalty=1.0,
                presence_penalty=p.presence_penalty,
                frequency_penalty=p.frequency_penalty,
            ):
                if job.cancel.is_set():
                    finish = "cancelled"
                    break
                if self._is_stop(token):
                    finish = "stop"
                    break
                produced += 1
                text = decoder.decode(self._model.detokenize([token], special=False))
                job.emit(TokenChunk(text, [token]))
                if produced >= limit:
                    break
        tail = decoder.decode(b"", final=True)
        if tail:
            job.emit(TokenChunk(tail, []))
        self._stats.generated_tokens += produced
        if finish == "cancelled":
            self._stats.cancelled += 1
        else:
            self._stats.completed += 1
        job.emit(GenerationDone(finish, len(prompt), produced, cached))

    def _prefill_all_but_last(self, prompt: list[int], cached: int) -> None:
        """Evaluate the prompt up to its last token, reusing the `cached` prefix.

        `Llama.generate` then decodes the last prompt token on its own. Doing that on every
        request, cold or warm, makes the logits the first sample is drawn from identical
        whatever the cache held before, so a seeded request reproduces exactly.
        """
        llama = self._llama
        if len(prompt) < 2:
            return
        if llama.n_tokens > cached:
            if not llama._ctx.kv_cache_seq_rm(-1, cached, -1):
                llama.reset()
                cached = 0
            llama.n_tokens = cached
        if cached < len(prompt) - 1:
            llama.eval(prompt[cached:-1])

    def close(self) -> None:
        self._jobs.put(None)
        self._worker.join(timeout=5)
        self._llama.close()
