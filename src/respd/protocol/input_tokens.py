"""The body of `POST /v1/responses/input_tokens`: the prompt-shaping subset of a create body."""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, model_validator

from respd.protocol.echo import check_response_echo
from respd.protocol.responses import ConversationRef, ReasoningConfig, TextConfig


class InputTokensRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    conversation: str | ConversationRef | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    truncation: Literal["auto", "disabled"] | None = None
    personality: str | None = None

    @model_validator(mode="after")
    def _echoable(self) -> Self:
        check_response_echo(self)  # the same values a create would be refused for
        return self
