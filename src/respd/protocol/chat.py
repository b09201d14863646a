"""The body of `POST /v1/chat/completions`."""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from respd.protocol.echo import check_reasoning_effort
from respd.protocol.routing import RoutingFields
from respd.protocol.sampling import DryFields

# OpenAI's `logit_bias`: token ids (as JSON object keys) to a finite bias in [-100, 100].
TokenId = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,10}$")]
LogitBias = Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None


class ChatCompletionRequest(DryFields, RoutingFields):
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]]
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    reasoning_effort: str | None = None
    service_tier: str | None = None
    logit_bias: dict[TokenId, LogitBias] | None = None
    # Benchmark extensions (vLLM, llama-server): equal-length runs.
    ignore_eos: bool | None = None
    min_tokens: int | None = None

    @model_validator(mode="after")
    def _known_effort(self) -> Self:
        check_reasoning_effort(self.reasoning_effort, "reasoning_effort")  # as Responses
        return self
