"""The engine protocol: what the service layer may ask of a model backend.

An engine knows models, templates and tokens; it knows nothing of the Responses API.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, Protocol

FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass
class ToolCall:
    """A function call the assistant made; `arguments` is the JSON text it produced."""

    id: str
    name: str
    arguments: str

    def as_template_dict(self) -> dict[str, Any]:
        # Hugging Face templates index `tool_call.function.arguments` and usually `tojson`
        # it, so a parsed object renders as the model was trained; unparsable text stays text.
        try:
            args: Any = json.loads(self.arguments)
        except ValueError:
            args = self.arguments
        if not isinstance(args, dict):
            args = self.arguments
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": args},
        }


@dataclass(frozen=True, eq=False)
class Image:
    """An image for a vision model: the encoded file (PNG, JPEG, ...), already decoded from
    its data URI / file / URL and checked by the service."""

    data: bytes
    mime_type: str = ""
    # The client's resolution hint (`low` | `high` | `auto` | `original`); an engine may use
    # it to pick how many tokens the image gets. It is not part of the digest.
    detail: str = "auto"

    @cached_property
    def digest(self) -> str:
        """Content hash: equal images share KV-cache prefixes whatever their source."""
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class ChatMessage:
    """One turn of the canonical conversation the service builds from API input."""

    role: str  # system | user | assistant | tool
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)  # assistant turns
    tool_call_id: str | None = None  # tool turns: the call this answers
    name: str | None = None  # tool turns: the function that produced it
    # Images of this turn, in order; each sits in `content` where the engine's
    # `media_marker` appears (one marker per image).
    images: list[Image] = field(default_factory=list)
    # Assistant turns: reasoning text of this turn (from `reasoning` input items), for
    # templates that render it (`reasoning_content`).
    reasoning: str | None = None

    def as_template_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.as_template_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        if self.reasoning is not None:
            # Qwen3/DeepSeek-style templates read `reasoning_content`; Gemma-style `reasoning`.
            out["reasoning_content"] = self.reasoning
            out["reasoning"] = self.reasoning
        return out


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # GBNF text the sampler must follow (llama.cpp grammar syntax, root rule `root`); the
    # service builds it from tool and response schemas. None: free generation.
    grammar: str | None = None
    # None: no logprobs. N (0-20): each generated token's logprob under the model, plus the
    # N most likely alternatives at that step.
    logprobs: int | None = None


@dataclass
class TopLogprob:
    token: str
    bytes: list[int]
    logprob: float


@dataclass
class TokenLogprob:
    """One generated token and how likely the model found it (natural log)."""

    token: str
    bytes: list[int]
    logprob: float
    top: list[TopLogprob] = field(default_factory=list)


@dataclass
class TokenChunk:
    """Newly generated text (possibly empty while a UTF-8 sequence is incomplete)."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    # One entry per token id when `SamplingParams.logprobs` is set.
    logprobs: list[TokenLogprob] = field(default_factory=list)


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
    template_source: str  # the chat template in use, for tool-format detection
    vision: bool  # the model sees images (a projector is loaded)
    media_marker: str  # where an image goes in rendered text: one marker per image

    def render_prompt(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """Render through the chat template; `tools` (`{"type":"function","function":…}`)
        reach it as the `tools` variable, the Hugging Face convention; `template_kwargs`
        (e.g. `enable_thinking`, `reasoning_effort`) become further template variables."""
        ...

    def check_grammar(self, grammar: str) -> None:
        """Raise ValueError when the engine's grammar sampler cannot parse `grammar`."""
        ...

    def tokenize(self, prompt: str, images: Sequence[Image] = ()) -> list[int]:
        """Token ids of a rendered prompt. Each `media_marker` in it is replaced by the
        positions of the next image in `images`, as placeholder ids (< 0) derived from the
        image's digest, so prompt lengths and prefix matching count images too. Raises
        ValueError when markers and images disagree or the model has no vision."""
        ...

    def generate(
        self,
        prompt_tokens: list[int],
        params: SamplingParams,
        *,
        cache_key: str | None = None,
        images: Sequence[Image] = (),
    ) -> GenerationStream:
        """Admit a request at once (raising `EngineBusy` when full) and return its stream of
        generated text; closing the stream early cancels the generation. `cache_key` steers
        requests that share a prompt prefix to the same cache slot. `images` are those
        `tokenize` placed in `prompt_tokens`, in the same order."""
        ...

    def stats(self) -> EngineStats: ...

    def close(self) -> None: ...
