"""A scripted engine shipped in the package, for fast tests of everything above the engines.

Like httpx's `MockTransport`: it implements the engine protocol for real — prompts are
rendered through a real chat template (ChatML unless told otherwise) by the same
`TemplatePrompter` the llama.cpp engine uses (images as llama.cpp's marker, each taking
`IMAGE_TOKENS` positions), and fitted to its window — but instead of a model it answers
each generation with a scripted `Reply`: text chunks (one token each), structured
fragments, an exception raised mid-stream, or an engine-reported failure.

    engine = FakeEngine([Reply(["Hello", " world"])])
    app = create_app(engine)   # then drive it with httpx.ASGITransport or the openai SDK

Tokens are characters (one id per character), so prompt lengths are easy to reason about.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from respd.engines.base import (
    Admitted,
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
from respd.engines.constraints import check_schema
from respd.engines.embedding import (
    EmbeddingInput,
    Embeddings,
    InputTooLong,
    TokenOutOfRange,
    normalized,
)
from respd.engines.families.profile import ModelProfile, detect_profile
from respd.engines.prompting import MEDIA_MARKER, TemplatePrompter

IMAGE_TOKENS = 4  # positions one image takes in a fake prompt


@dataclass
class Reply:
    """One scripted generation. Each item of `chunks` is one step of the stream: a string
    (one token of text), a `TokenChunk` (sent as it is), or an exception (raised by the
    stream at that point, as a broken engine would). After the chunks the stream ends with
    `finish` (`error` then carries `error`), unless the request's `max_tokens` ran out
    first (`length`)."""

    chunks: Sequence[str | TokenChunk | BaseException] = ()
    finish: FinishReason = "stop"
    error: str | None = None
    cached_tokens: int = 0
    delay: float = 0.0  # seconds before each chunk, to let tests act mid-stream
    status: int | None = None  # with an error: the HTTP status a remote engine would map it to
    # What the stream sends instead of the rest when asked to `wrap_up` (a constrained
    # answer closing its value), then ending `length`; None: it cannot, and is cancelled.
    closing: Sequence[str] | None = None


@dataclass
class Call:
    """What one `generate` received (tests inspect these)."""

    prompt: Prompt
    params: SamplingParams
    cache_key: str | None
    cancelled: bool = False
    retain: bool = False
    wrapped: bool = False  # the reader asked it to wrap up


class FakeEngine:
    """An engine whose generations are scripted. `replies` are used in order; or pass
    `respond`, a function from the prompt (and sampling) to a `Reply`."""

    def __init__(
        self,
        replies: Iterable[Reply | str] = (),
        *,
        respond: Callable[[Prompt, SamplingParams], Reply] | None = None,
        model_id: str = "fake-model",
        context_window: int = 4096,
        template: str = FALLBACK_TEMPLATE,
        profile: ModelProfile | None = None,
        vision: bool = False,
        capacity: int = 64,
        default_sampling: dict[str, float] | None = None,
        n_vocab: int | None = None,
    ) -> None:
        self.model_id = model_id
        self.context_window = context_window
        self.vision = vision
        self.profile = profile or detect_profile(template)
        self.default_sampling = dict(default_sampling or {"temperature": 1.0, "top_p": 1.0})
        self.n_vocab = n_vocab
        self.prompter = TemplatePrompter(
            ChatTemplate(template), self.profile, self._tokenize, context_window, MEDIA_MARKER
        )
        self._replies: deque[Reply] = deque(
            Reply([r]) if isinstance(r, str) else r for r in replies
        )
        self._respond = respond
        self.capacity = capacity
        self.calls: list[Call] = []
        self.prewarmed: list[Call] = []  # `prewarm` calls, which generate nothing
        self._stats = EngineStats()
        self._running = 0
        self.closed = False

    # -- the engine protocol --------------------------------------------------------------

    def check_schema(self, schema: dict[str, Any]) -> None:
        check_schema(schema)

    async def prepare(self, request: PromptRequest) -> Prompt:
        prompt = self.prompter.build(request)
        prompt.compiled = request.constraint
        return prompt

    def generate(
        self,
        prompt: Prompt,
        params: SamplingParams,
        *,
        cache_key: str | None = None,
        retain: bool = False,
    ) -> GenerationStream:
        if self._running >= self.capacity:
            raise EngineBusy(f"all {self.capacity} fake slots are busy")
        reply = self._next_reply(prompt, params)
        call = Call(prompt, params, cache_key, retain=retain)
        self.calls.append(call)
        self._running += 1
        return _FakeStream(self, call, reply)

    async def prewarm(
        self, prompt: Prompt, *, cache_key: str | None = None, retain: bool = False
    ) -> int:
        """Nothing to warm: the call is recorded (`prewarmed`), no reply is used."""
        if self._running >= self.capacity:
            raise EngineBusy(f"all {self.capacity} fake slots are busy")
        self.prewarmed.append(Call(prompt, SamplingParams(max_tokens=0), cache_key, retain=retain))
        return 0

    def stats(self) -> EngineStats:
        self._stats.running = self._running
        return self._stats

    def close(self) -> None:
        self.closed = True

    # -- scripting ------------------------------------------------------------------------

    def add(self, *replies: Reply | str) -> None:
        """Queue more replies."""
        self._replies.extend(Reply([r]) if isinstance(r, str) else r for r in replies)

    @property
    def renders(self) -> int:
        """How many times a prompt was rendered so far."""
        return self.prompter.renders

    def _next_reply(self, prompt: Prompt, params: SamplingParams) -> Reply:
        if self._replies:
            return self._replies.popleft()
        if self._respond is not None:
            return self._respond(prompt, params)
        raise AssertionError("FakeEngine: no scripted reply left for this generation")

    def _tokenize(self, text: str, images: Sequence[Image]) -> list[int]:
        # Each image sits where the prompter wrote its marker, as in llama.cpp.
        parts = text.split(self.prompter.marker)
        if len(parts) - 1 != len(images):
            raise ValueError(
                f"the prompt has {len(parts) - 1} image markers for {len(images)} images"
            )
        if images and not self.vision:
            raise ValueError(f"the model '{self.model_id}' has no image input")
        tokens: list[int] = []
        for i, part in enumerate(parts):
            tokens += [ord(c) for c in part]
            if i < len(images):
                tokens += [-1 - i] * IMAGE_TOKENS
        return tokens

    def _ended(self, call: Call, done: GenerationDone) -> None:
        self._running -= 1
        s = self._stats
        s.generated_tokens += done.completion_tokens
        s.prompt_tokens += done.prompt_tokens
        s.cached_tokens += done.cached_tokens
        if done.finish_reason == "cancelled":
            s.cancelled += 1
            call.cancelled = True
        elif done.finish_reason == "error":
            s.failed += 1
        else:
            s.completed += 1


class _FakeStream:
    def __init__(self, engine: FakeEngine, call: Call, reply: Reply) -> None:
        self._engine = engine
        self._call = call
        self._reply = reply
        self._steps = list(reply.chunks)
        self._produced = 0
        self._done = False
        self._admitted = False
        self._cancel = False
        self._limit = call.params.max_tokens
        self._finish = reply.finish

    def __aiter__(self) -> _FakeStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        if self._done:
            raise StopAsyncIteration
        if not self._admitted:
            self._admitted = True
            return Admitted()
        if self._cancel:
            return self._end("cancelled")
        if self._reply.delay:
            await asyncio.sleep(self._reply.delay)
        else:
            await asyncio.sleep(0)
        if self._limit is not None and self._produced >= self._limit and self._steps:
            return self._end("length")
        if not self._steps:
            return self._end(self._finish, self._reply.error)
        step = self._steps.pop(0)
        if isinstance(step, BaseException):
            self._end("error", str(step), emit=False)
            raise step
        chunk = step if isinstance(step, TokenChunk) else TokenChunk(step, [0])
        self._produced += chunk.n_tokens
        return chunk

    def _end(
        self, reason: FinishReason, error: str | None = None, *, emit: bool = True
    ) -> GenerationDone:
        self._done = True
        done = GenerationDone(
            reason,
            self._call.prompt.n_tokens,
            self._produced,
            self._reply.cached_tokens,
            error=error,
            status=self._reply.status if reason == "error" else None,
        )
        self._engine._ended(self._call, done)
        return done

    def cancel(self) -> None:
        self._cancel = True

    def wrap_up(self) -> bool:
        self._call.wrapped = True
        if self._reply.closing is None:
            self.cancel()
            return False
        self._steps, self._finish = list(self._reply.closing), "length"
        return True

    async def aclose(self) -> None:
        if not self._done:
            self._end("cancelled")


class FakeEmbedder:
    """An embedder for tests of the layers above it: a text's vector counts its words, each
    hashed to one of `width` dimensions (token ids count as words), so texts that share
    words point the same way. Tokens are characters, as `FakeEngine`'s are."""

    def __init__(self, model_id: str = "fake-embed", *, width: int = 64, max_tokens: int = 512):
        self.model_id = model_id
        self.width = width
        self.max_tokens: int | None = max_tokens
        self.calls: list[list[EmbeddingInput]] = []

    async def embed(self, inputs: list[EmbeddingInput]) -> Embeddings:
        self.calls.append(inputs)
        vectors, tokens = [], 0
        for i, item in enumerate(inputs):
            ids = [ord(c) for c in item] if isinstance(item, str) else item
            if any(not 0 <= t < 0x110000 for t in ids):
                raise TokenOutOfRange(i, 0x110000)
            if self.max_tokens is not None and len(ids) > self.max_tokens:
                raise InputTooLong(i, len(ids), self.max_tokens)
            words = item.lower().split() if isinstance(item, str) else [str(t) for t in item]
            vector = [0.0] * self.width
            for word in words:
                vector[zlib.crc32(word.strip(".,!?").encode()) % self.width] += 1.0
            vectors.append(normalized(vector))
            tokens += len(ids)
        return Embeddings(vectors, tokens)

    def close(self) -> None:
        pass
