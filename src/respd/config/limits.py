"""The flags that bound what one request, and one caller, may ask for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from respd.service.files import DEFAULT_MAX_FILE_BYTES
from respd.service.limits import (
    DEFAULT_MAX_INPUT_CHARS,
    DEFAULT_MAX_INPUT_ITEMS,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_TOOLS,
    InputLimits,
)

if TYPE_CHECKING:
    from respd.api.quotas import QuotaSettings


class LimitsConfig(BaseModel):
    model_config = ConfigDict(title="Request limits")

    max_request_bytes: int = Field(
        DEFAULT_MAX_REQUEST_BYTES,
        ge=1,
        description="Largest JSON request body in bytes; more is a 413 (uploads to /v1/files "
        "are bounded by --max-file-bytes instead).",
    )
    max_file_bytes: int = Field(
        DEFAULT_MAX_FILE_BYTES,
        ge=1,
        description="Largest upload POST /v1/files accepts, in bytes; a larger one is a 413 "
        "and nothing is stored.",
    )
    max_input_items: int = Field(
        DEFAULT_MAX_INPUT_ITEMS,
        ge=1,
        description="Most input items (Responses) or messages (Chat) one request may send.",
    )
    max_input_chars: int = Field(
        DEFAULT_MAX_INPUT_CHARS,
        ge=1,
        description="Most characters one request may give the model to read: its input, "
        "instructions and tools, wherever they sit (the payloads of images and files are "
        "bounded by their own limits).",
    )
    max_output_tokens_limit: int | None = Field(
        None,
        ge=1,
        description="Most tokens one request may ask to generate (max_output_tokens, "
        "max_tokens, max_completion_tokens); more is a 400. Default: what fits in the "
        "context window.",
    )
    max_tools: int = Field(
        DEFAULT_MAX_TOOLS, ge=0, description="Most tools one request may declare."
    )
    max_streams_per_key: int = Field(
        0,
        ge=0,
        description="Most streaming requests one API key (identity) may have open at once; "
        "more is a 429. 0: no limit.",
    )
    rate_limit_rpm: int = Field(
        0,
        ge=0,
        description="Requests per minute each API key (identity) may make to the generating "
        "routes; beyond it a 429 with retry-after and x-ratelimit-* headers. 0: no limit.",
    )
    rate_limit_tpm: int = Field(
        0,
        ge=0,
        description="Tokens (input + output) per minute each API key (identity) may use; a "
        "request made while the minute's tokens are spent is a 429. 0: no limit.",
    )

    def input_limits(self) -> InputLimits:
        return InputLimits(
            self.max_input_items, self.max_input_chars, self.max_tools, self.max_output_tokens_limit
        )

    def quota_settings(self) -> QuotaSettings:
        from respd.api.quotas import QuotaSettings  # the web stack: only once it is served

        return QuotaSettings(self.rate_limit_rpm, self.rate_limit_tpm, self.max_streams_per_key)
