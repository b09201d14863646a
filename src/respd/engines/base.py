"""The engine protocol: what the service layer may ask of a model backend.

An engine knows models, templates and tokens; it knows nothing of the Responses API.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass
class ChatMessage:
    """One turn of the canonical conversation the service builds from API input."""

    role: str  # system | user | assistant | tool
    content: str

    def as_template_dict(self) -> dict[str, Any]:
        return {"role": self.role, "content": self.content}


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


@dataclass
class TokenChunk:
    """Newly generated text (possibly empty while a UTF-8 sequence is incomplete)."""

    text: str
    token_ids: list[int] = field(default_factory=list)


@dataclass
class GenerationDone:
    """The last item of every generation stream."""

    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    error: str | None = None  # set when finish_reason is "error"


GenerationEvent = TokenChunk | GenerationDone


@dataclass
class EngineStats:
    """Counters for /health and tests: is anything still generating after a client left?"""

    running: int = 0
    queued: int = 0
    completed: int = 0
    cancelled: int = 0
    generated_tokens: int = 0


class GenerationStream(Protocol):
    """Async iterator of one request's events; `aclose()` cancels the request."""

    def __aiter__(self) -> GenerationStream: ...

    async def __anext__(self) -> GenerationEvent: ...

    async def aclose(self) -> None: ...


class EngineBusy(Exception):
    """Every slot and the whole queue are taken: the caller should retry later."""


class Engine(Protocol):
    """A loaded model that renders, tokenizes and generates."""

    model_id: str
    context_window: int

    def render_prompt(
        self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True
    ) -> str: ...

    def tokenize(self, prompt: str) -> list[int]: ...

    def generate(
        self, prompt_tokens: list[int], params: SamplingParams, *, cache_key: str | None = None
    ) -> GenerationStream:
        """Admit a request at once (raising `EngineBusy` when full) and return its stream of
        generated text; closing the stream early cancels the generation. `cache_key` steers
        requests that share a prompt prefix to the same cache slot."""
        ...

    def stats(self) -> EngineStats: ...

    def close(self) -> None: ...
