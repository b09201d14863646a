"""The one vocabulary of generation output that both APIs read.

A generation is a stream of these events: answer text (with the logprobs of the tokens that
produced it, when asked for), thinking text, the start of a tool call, its argument text as
it is generated, the end of a call, and one `Finished` last. Responses turns them into typed
SSE events and output items; Chat Completions into deltas and a message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from respd.engines.base import TokenLogprob
from respd.engines.route import RouteReport


@dataclass
class Started:
    """The engine took the generation up (it may have waited for a free slot)."""


@dataclass
class TextDelta:
    text: str
    # Where `text` starts in all the raw text read so far (message text is always a verbatim
    # run of it), so token logprobs can follow their text; -1: unknown.
    start: int = field(default=-1, compare=False)
    logprobs: list[TokenLogprob] | None = field(default=None, compare=False)


@dataclass
class ReasoningDelta:
    """Thinking text, ahead of the answer."""

    text: str


@dataclass
class CallStarted:
    index: int
    name: str


@dataclass
class ArgumentsDelta:
    index: int
    delta: str


@dataclass
class CallFinished:
    index: int
    name: str
    arguments: str
    complete: bool  # False when the generation ended inside the call


@dataclass
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0


FinishKind = Literal["stop", "length", "cancelled", "interrupted", "steered", "error"]


@dataclass
class Finished:
    """The last event. `reason`: `stop` (the model ended its turn, or a stop sequence or a
    repeated call ended it), `length` (the token budget ran out), `cancelled` (on request),
    `interrupted` (the server is shutting down), `error`."""

    reason: FinishKind
    usage: Usage
    calls: int = 0  # tool calls made
    error: str | None = None
    status: int | None = None  # see `GenerationDone.status`
    # Why a `length` end came before the budget ran out: "repetition" (the output looped).
    cause: str | None = None
    route: RouteReport | None = None  # which provider answered (a routed model)


OutputEvent = TextDelta | ReasoningDelta | CallStarted | ArgumentsDelta | CallFinished
StreamEvent = Started | OutputEvent | Finished
