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
    from respd.service.quotas import QuotaSettings


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
        description="Most work one API key (identity) may have running at once: streamed "
        "responses and chat completions, responses over WebSocket, and background responses "
        "queued or running share this budget; more is a 429. 0: no limit.",
    )
    max_background_per_key: int = Field(
        0,
        ge=0,
        description="Most background responses one API key may have queued or running; "
        "another is a 429 until one ends. 0: no limit.",
    )
    max_storage_bytes_per_key: int = Field(
        0,
        ge=0,
        description="Bytes one API key may keep stored: uploaded files plus stored responses. "
        "An upload that would pass it is a 413; once it is reached, a response to store is "
        "a 429 (store: false still runs). 0: no limit.",
    )
    max_websockets_per_key: int = Field(
        0,
        ge=0,
        description="WebSocket connections one API key may hold open at once; another is "
        "refused at the upgrade. 0: no limit.",
    )
    max_websockets: int = Field(
        0,
        ge=0,
        description="WebSocket connections the server holds open at once, all keys "
        "together; another is refused at the upgrade. 0: no limit.",
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
        from respd.service.quotas import QuotaSettings

        return QuotaSettings(
            requests_per_minute=self.rate_limit_rpm,
            tokens_per_minute=self.rate_limit_tpm,
            streams_per_key=self.max_streams_per_key,
            background_per_key=self.max_background_per_key,
            storage_bytes_per_key=self.max_storage_bytes_per_key,
            sockets_per_key=self.max_websockets_per_key,
            sockets_total=self.max_websockets,
        )
