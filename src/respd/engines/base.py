"""The engine protocol: what the service layer may ask of a model backend.

An engine knows models, templates and tokens; it knows nothing of the Responses API. The
protocol fits two kinds of backend:

- a **token-level** engine (llama.cpp in-process): it renders the conversation through the
  model's chat template, tokenizes it, fits it into the context window, compiles output
  constraints into its grammar sampler and streams raw generated text, which the service
  reads with the model family's `profile`;
- a **message-level** engine (a remote OpenAI-compatible chat server): it sends the
  messages, tools and JSON Schemas as they are and streams text, reasoning and tool-call
  fragments the server already separated (`TokenChunk.reasoning` / `.calls`).

So everything the service hands over is engine-neutral: messages, tool definitions, a
`Constraint` (JSON Schemas and a call policy), the reasoning effort, sampling settings.
`prepare` is the one place a prompt is built (rendered once); `generate` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from respd.engines.constraints import Constraint
from respd.engines.families.profile import ModelProfile

# The conversation's values live below the protocol (constraints and families read them
# too); callers know them as part of it, so they are re-exported here.
from respd.engines.messages import ChatMessage, Image, ToolDefinition
from respd.engines.messages import ToolCall as ToolCall
from respd.engines.route import Route, RouteReport

FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass
class SamplingParams:
    """How tokens are drawn. None means "the engine's default" (for a local model the
    sampling its GGUF metadata recommends; a remote server applies its own)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float | None = None
    # None: no logprobs. N (0-20): each generated token's logprob under the model, plus the
    # N most likely alternatives at that step.
    logprobs: int | None = None
    stop: list[str] = field(default_factory=list)
    # Benchmark extensions (vLLM, llama-server): end-of-generation tokens cannot end the
    # output at all (`ignore_eos`, so only `max_tokens` ends it) or not before `min_tokens`.
    ignore_eos: bool = False
    min_tokens: int = 0
    # Chat's `logit_bias`: added to these tokens' logits before any other sampler.
    logit_bias: dict[int, float] = field(default_factory=dict)
    # llama.cpp's DRY ("don't repeat yourself") sampler, under llama-server's names: a
    # sequence that would extend a repeat of earlier output longer than `dry_allowed_length`
    # tokens is penalized by multiplier * base ** (length - allowed); a breaker string ends
    # the sequences matched. Multiplier 0 disables it; None: the engine's default.
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None  # tokens looked back over; -1: the whole context
    dry_sequence_breakers: list[str] | None = None


@dataclass
class PromptRequest:
    """A conversation to turn into a prompt, and what its output must look like."""

    messages: list[ChatMessage]
    # The functions the model is offered this turn (already narrowed by the tool policy).
    tools: list[ToolDefinition] = field(default_factory=list)
    constraint: Constraint | None = None
    # The client's reasoning effort as given (`low`, `high`, `none`, ...); None: not asked.
    reasoning_effort: str | None = None
    reserve: int = 1  # tokens kept free for the output
    truncate: bool = False  # drop the oldest turns to fit, instead of refusing
    # The client's provider preferences, for an engine that routes across providers.
    route: Route | None = None


@dataclass
class Prompt:
    """A prepared prompt, ready for `Engine.generate` (built by `Engine.prepare`)."""

    request: PromptRequest
    messages: list[ChatMessage]  # those kept after fitting
    n_tokens: int  # prompt tokens (exact for token-level engines; an estimate otherwise)
    # The rendered prompt already opens a thinking block: the output starts inside it.
    reasoning_open: bool = False
    tokens: list[int] = field(default_factory=list)  # token-level engines
    images: list[Image] = field(default_factory=list)  # those `tokens` hold, in order
    compiled: Any = None  # the engine's own form of `request.constraint`


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
class CallDelta:
    """A fragment of a tool call, from an engine that reports calls already parsed: the
    first fragment of call `index` carries its `name`."""

    index: int
    name: str | None = None
    arguments: str = ""


@dataclass
class TokenChunk:
    """Newly generated output. `text` is raw model text (possibly empty while a UTF-8
    sequence is incomplete); a message-level engine also fills `reasoning` and `calls`."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    # One entry per generated token when `SamplingParams.logprobs` is set.
    logprobs: list[TokenLogprob] = field(default_factory=list)
    reasoning: str = ""
    calls: list[CallDelta] = field(default_factory=list)
    tokens: int | None = None  # tokens this chunk stands for when `token_ids` is not known

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids) if self.tokens is None else self.tokens


@dataclass
class GenerationDone:
    """The last item of every generation stream."""

    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    error: str | None = None  # set when finish_reason is "error"
    reasoning_tokens: int | None = None  # when the engine counts them itself
    # An error a remote engine met, as the HTTP status a non-streaming client gets: the
    # upstream's own 4xx (its message in `error` is the client's to read), 502 when the
    # upstream failed or could not be reached, 504 when it timed out.
    status: int | None = None
    # Which provider answered, for an engine that routes across several.
    route: RouteReport | None = None


@dataclass
class Admitted:
    """The engine took the request up (a slot, a connection): sent once, before its first
    chunk, by engines where a request may wait for capacity."""


GenerationEvent = Admitted | TokenChunk | GenerationDone


@dataclass(frozen=True)
class Detail:
    """How an engine-specific counter is exported: its Prometheus family (without
    `_total`), what it counts, whether it is a level rather than a running total, and the
    labels that set it apart within a family split by label."""

    metric: str
    help: str
    gauge: bool = False
    labels: tuple[tuple[str, str], ...] = ()


# The engine-specific counters respd knows by name (dashboards read them); every engine
# reports them, as 0 where it has none, so the series and /health keys never change shape.
DETAILS: dict[str, Detail] = {
    # Saved KV states outliving their slot: prompt tokens restored from them (counted in
    # `cached_tokens` too), and the bytes the RAM and disk tiers hold.
    "kv_restored_tokens": Detail(
        "respd_kv_restored_tokens",
        "Prompt tokens restored from saved KV states instead of prefilled.",
    ),
    "kv_cache_ram_bytes": Detail(
        "respd_kv_cache_bytes",
        "Bytes of saved KV states the engine holds, by tier (ram, disk).",
        gauge=True,
        labels=(("tier", "ram"),),
    ),
    "kv_cache_disk_bytes": Detail(
        "respd_kv_cache_bytes",
        "Bytes of saved KV states the engine holds, by tier (ram, disk).",
        gauge=True,
        labels=(("tier", "disk"),),
    ),
    # Speculative decoding: draft tokens decoded, and those the sampler then chose too.
    "draft_tokens": Detail(
        "respd_draft_tokens", "Tokens guessed by speculative decoding and decoded for checking."
    ),
    "draft_accepted": Detail(
        "respd_draft_accepted_tokens",
        "Guessed tokens the sampler drew too (each saved a decode step).",
    ),
    # Jump-forward: text a grammar forced, decoded as a draft, and the tokens of it the
    # sampler then chose too.
    "jump_forward_tokens": Detail(
        "respd_jump_forward_tokens",
        "Tokens of grammar-forced text decoded as a draft for checking.",
    ),
    "jump_forward_accepted": Detail(
        "respd_jump_forward_accepted_tokens",
        "Grammar-forced draft tokens the sampler drew too (each saved a decode step).",
    ),
    # Image work: images tokenized into chunks by the projector (not found in its cache),
    # and image chunks whose embeddings the vision encoder computed.
    "images_tokenized": Detail(
        "respd_images_tokenized",
        "Images the projector turned into chunks (not found in its cache).",
    ),
    "image_chunks_encoded": Detail(
        "respd_image_chunks_encoded",
        "Image chunks whose embeddings the vision encoder computed.",
    ),
}


def detail_of(key: str) -> Detail:
    """How `key` is exported: as `DETAILS` says, or as a gauge named after it."""
    return DETAILS.get(key) or Detail(f"respd_engine_{key}", f"Engine counter {key}.", True)


@dataclass
class EngineStats:
    """Counters for /health, /metrics and tests: those every engine keeps, and in
    `details` the engine's own (speculation, KV tiers, image work, ...)."""

    running: int = 0
    queued: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    # False when the engine cannot serve any more (its worker died, the upstream is gone).
    healthy: bool = True
    problem: str | None = None
    details: dict[str, int | float] = field(default_factory=dict)

    def add(self, key: str, amount: int | float) -> None:
        """Count `amount` more of the engine-specific counter `key`."""
        self.details[key] = self.details.get(key, 0) + amount

    def all_details(self) -> dict[str, int | float]:
        """The engine's counters, the known ones it does not keep as 0."""
        return {**dict.fromkeys(DETAILS, 0), **self.details}

    def as_dict(self) -> dict[str, Any]:
        """Every counter under its own key, the engine's beside the common ones (/health)."""
        common = {k: v for k, v in vars(self).items() if k != "details"}
        return {**common, **self.all_details()}


class GenerationStream(Protocol):
    """Async iterator of one request's events; `aclose()` cancels the request."""

    def __aiter__(self) -> GenerationStream: ...

    async def __anext__(self) -> GenerationEvent: ...

    def cancel(self) -> None:
        """Stop generating soon; the stream still ends with its `GenerationDone`
        (`cancelled`), so the reader learns what was produced."""
        ...

    def wrap_up(self) -> bool:
        """End the output as soon as it can be whole: a grammar-constrained answer closes
        its value in the fewest tokens and ends `length`; true when that is under way.
        False when this stream cannot close its output: it is cancelled instead."""
        ...

    async def aclose(self) -> None: ...


class EngineBusy(Exception):
    """Every slot and the whole queue are taken: the caller should retry later."""


class PromptError(Exception):
    """The conversation cannot become a prompt (the template rejects it, images and markers
    disagree, ...): the request's fault."""


class PromptTooLong(Exception):
    """The prompt plus `reserve` does not fit the context window (even after truncating,
    when `truncated`)."""

    def __init__(self, n_tokens: int, window: int, reserve: int, *, truncated: bool) -> None:
        super().__init__(f"{n_tokens} prompt tokens + {reserve} do not fit {window}")
        self.n_tokens = n_tokens
        self.window = window
        self.reserve = reserve
        self.truncated = truncated


class Engine(Protocol):
    """A loaded model (local or remote) that prepares prompts and generates."""

    model_id: str
    context_window: int
    vision: bool  # the model sees images
    profile: ModelProfile  # how this model family writes tool calls, thinking, images
    # Sampling applied when a request sets none (`temperature`, `top_p`, ...); what the
    # engine does not say, the server it talks to decides.
    default_sampling: dict[str, float]
    # Token ids run from 0 to n_vocab - 1; None where the engine cannot say (a remote
    # server checks the ids it is sent itself).
    n_vocab: int | None

    def check_schema(self, schema: dict[str, Any]) -> None:
        """Raise `constraints.SchemaRejected` when this engine cannot enforce `schema`
        (called while reading a request, before anything is built)."""
        ...

    async def prepare(self, request: PromptRequest) -> Prompt:
        """Build the prompt: render once, fit the window (raising `PromptTooLong`), compile
        the constraint (raising `constraints.ConstraintError`). Raises `PromptError` for a
        conversation the model cannot take."""
        ...

    def generate(
        self,
        prompt: Prompt,
        params: SamplingParams,
        *,
        cache_key: str | None = None,
        retain: bool = False,
    ) -> GenerationStream:
        """Admit a request at once (raising `EngineBusy` when full) and return its stream;
        closing the stream early cancels the generation. `cache_key` steers requests that
        share a prompt prefix to the same cache; `retain` asks that the prompt's cache be
        kept in the longest-lived tier the engine has, and evicted after the others."""
        ...

    async def prewarm(
        self, prompt: Prompt, *, cache_key: str | None = None, retain: bool = False
    ) -> int:
        """Put `prompt` in the engine's cache without generating (as `generate` would,
        raising `EngineBusy` when full) and return how many of its tokens were cached
        already; an engine that keeps no cache of its own does nothing and returns 0."""
        ...

    def stats(self) -> EngineStats: ...

    def close(self) -> None: ...
