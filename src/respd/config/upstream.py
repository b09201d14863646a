"""The flags of models served by OpenAI-compatible servers elsewhere (`--engine openai`,
`--upstream`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import NoDecode


class UpstreamConfig(BaseModel):
    model_config = ConfigDict(title="Upstream engines")

    upstream_url: str | None = Field(
        None,
        description="With --engine openai: the upstream's base URL, ending in /v1 (e.g. "
        "http://127.0.0.1:8000/v1).",
    )
    upstream_api_key: str | None = Field(
        None, description="With --engine openai: the key sent to the upstream as a Bearer token."
    )
    upstream_model: str | None = Field(
        None,
        description="With --engine openai: the model name the upstream serves. Default: the "
        "first model its /v1/models lists.",
    )
    upstream: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="More models from OpenAI-compatible servers, beside the main engine: "
        "ALIAS=URL[,model=NAME][,key=KEY][,ctx=TOKENS][,vision=true][,tool_choice=false]"
        "[,response_format=false], repeatable (the env var takes several separated by ';'). "
        "Clients ask for ALIAS; respd sends NAME (default: the upstream's first model). "
        "tool_choice=false / response_format=false: the upstream cannot force calls / "
        "enforce schemas, so such requests are a 400.",
    )

    @field_validator("upstream", mode="before")
    @classmethod
    def _semicolon_separated(cls, value: object) -> object:
        """An upstream entry holds commas, so several in one env var are `;`-separated."""
        if isinstance(value, str):
            return [p.strip() for p in value.split(";") if p.strip()]
        return value
