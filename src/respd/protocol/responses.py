"""The body of `POST /v1/responses`: every field of the OpenAI create body is declared here.

Items inside `input` stay loosely typed (dicts) here; `service/translate.py` walks them and
raises errors that name the exact `input[i]...` path, the way OpenAI does.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from respd.protocol.echo import check_response_echo
from respd.protocol.errors import InvalidRequest
from respd.protocol.routing import RoutingFields
from respd.protocol.sampling import DryFields


class _Lenient(BaseModel):
    """Unknown keys are kept (and logged by the API layer), never a 400."""

    model_config = ConfigDict(extra="allow")


class TextFormat(_Lenient):
    type: str = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(_Lenient):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(_Lenient):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None
    context: str | None = None
    mode: str | None = None


class StreamOptions(_Lenient):
    include_obfuscation: bool | None = None


class ConversationRef(_Lenient):
    id: str


class CreateResponseRequest(_Lenient, DryFields, RoutingFields):
    model: str
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    include: list[str] | None = None
    store: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    background: bool | None = None
    background_options: dict[str, Any] | None = None
    previous_response_id: str | None = None
    conversation: str | ConversationRef | None = None
    prompt: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    truncation: Literal["auto", "disabled"] | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    context_management: list[dict[str, Any]] | None = None
    moderation: dict[str, Any] | None = None
    access_programs: dict[str, Any] | None = None
    image: dict[str, Any] | None = None
    verbosity: str | None = None  # `responses.parse()` sends it at the top level
    # Sampling extras common to local servers (llama-server, vLLM); not in OpenAI's body.
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # Benchmark extensions (vLLM, llama-server): equal-length runs.
    ignore_eos: bool | None = None
    min_tokens: int | None = None

    @field_validator("prompt_cache_retention", mode="before")
    @classmethod
    def _retention_spelling(cls, value: Any) -> Any:
        """`in-memory`, as OpenAI's guide spells it, is the SDK's `in_memory`."""
        return "in_memory" if value == "in-memory" else value

    @model_validator(mode="after")
    def _echoable(self) -> Self:
        check_response_echo(self)  # a 400 now, not a failure once the Response is built
        return self


INCLUDABLE = frozenset(
    {
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
        "reasoning.encrypted_content",
        "message.output_text.logprobs",
    }
)


def check_include(values: list[str]) -> None:
    """Every `include` value must be one OpenAI defines."""
    for value in values:
        if value not in INCLUDABLE:
            raise InvalidRequest(
                f"Invalid value for 'include': {value!r}. Supported values are: "
                f"{', '.join(sorted(INCLUDABLE))}.",
                param="include",
                code="invalid_value",
            )
