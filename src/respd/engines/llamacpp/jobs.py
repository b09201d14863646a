"""A request as the decode worker runs it (`Job`), and the event stream its caller reads.

A job carries its prompt, where its images sit in it, and the state the worker keeps for
it while it holds a slot: its sampler chain, how much of the prompt is decoded, its
speculation draft and the decoder that turns its tokens into text.
"""

from __future__ import annotations

import asyncio
import codecs
import ctypes
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from respd.engines.base import GenerationDone, GenerationEvent, SamplingParams
from respd.engines.llamacpp.closing import Closer
from respd.engines.llamacpp.jumpforward import Spacing
from respd.engines.llamacpp.multimodal import ImageChunk
from respd.engines.llamacpp.outbox import Batch, EventBuffer, Outbox
from respd.engines.llamacpp.sampler import GrammarCheckedSampler
from respd.engines.llamacpp.slots import Slot
from respd.engines.llamacpp.speculation import NgramLookup


@dataclass(eq=False)
class Job:
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
    # Its KV goes after every other saved state (`prompt_cache_retention` "24h").
    retain: bool = False
    closes: bool = False  # its grammar's value may be closed before its limit
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
    # Closes its grammar's value before its limit cuts it (see `closing.py`); once that
    # overrode the model's choice, the job ends as cut by the limit, whatever ends it.
    closer: Closer | None = None
    closed_early: bool = False
    wrap_up: bool = False  # the reader asked it to close now (its output looped)
    # Prompt-lookup speculation: the history's n-gram index (built at the first draft) and
    # the draft decoded after `next_token` this step, which the samples then verify.
    lookup: NgramLookup | None = None
    draft: list[int] = field(default_factory=list)
    jumped: bool = False  # the draft is text its grammar forced (jump-forward)
    spacing: Spacing = field(default_factory=Spacing)  # its output's spaces, for such drafts
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


class JobStream:
    """The events of one job. Closing it, or dropping it unread, cancels the job."""

    def __init__(self, job: Job, release: Callable[[Job], None]) -> None:
        self._job = job
        self._events = EventBuffer(job.out)
        self._release = release
        self._done = False

    def __aiter__(self) -> JobStream:
        return self

    def cancel(self) -> None:
        self._release(self._job)

    def wrap_up(self) -> bool:
        """A job whose answer may close early (see `closing.py`) closes it from its next
        sample on; any other job is cancelled."""
        if not self._job.closes:
            self.cancel()
            return False
        self._job.wrap_up = True  # read by the worker thread at its next sample
        return True

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
        # The worker's lock is reentrant, so this is safe on the worker thread too.
        self._release(self._job)
