"""The flags of who may call the server, and of the secret that seals client-held state."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import NoDecode

from respd.config.lists import comma_separated


class KeysConfig(BaseModel):
    model_config = ConfigDict(title="Keys and secrets")

    api_key: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="An API key clients must send (Authorization: Bearer KEY or X-Api-Key); "
        "repeat the flag (or comma-separate the env var) for several. No keys at all: the "
        "server is open to anyone who can reach it.",
    )
    api_keys_file: Path | None = Field(
        None,
        description="File of API keys, one per line: KEY [LABEL] ('#' starts a comment); "
        "re-read on SIGHUP. A label names the identity that owns what its key creates (keys "
        "sharing a label share their data; logs show the label, never the key).",
    )
    metrics_api_key: str | None = Field(
        None,
        description="When set, GET /metrics requires this key (Authorization: Bearer KEY or "
        "X-Api-Key); else /metrics is public.",
    )
    state_key: str | None = Field(
        None,
        description="Secret that seals the state respd hands to clients (encrypted reasoning, "
        "compaction items); give every replica the same one. Default: a key kept in "
        "--data-dir (state.key), made on first start.",
    )

    @field_validator("api_key", mode="before")
    @classmethod
    def _comma_separated_keys(cls, value: object) -> object:
        return comma_separated(value)
