"""The flags of models served by OpenAI-compatible servers elsewhere (`--engine openai`,
`--upstream`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import NoDecode

from respd.engines.routing import provider as routing


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
        "[,response_format=false][,provider=NAME][,model_id=PUBLIC][,price_prompt=USD]"
        "[,price_completion=USD][,concurrency=N][,timeout=SECS], repeatable (the env var "
        "takes several separated by ';'). Clients ask for ALIAS; respd sends NAME (default: "
        "the upstream's first model). tool_choice=false / response_format=false: the "
        "upstream cannot force calls / enforce schemas, so such requests are a 400. "
        "Entries naming one model_id (e.g. meta/llama-3) serve it together, routed by the "
        "request's provider object with fallback: provider names the entry there (default: "
        "ALIAS), prices are USD per million tokens, concurrency caps its requests at once, "
        "timeout is the seconds to its first output before the next is tried.",
    )
    upstreams_file: Path | None = Field(
        None,
        description="A TOML file of more upstream entries: [[upstream]] tables with alias, "
        "url and the --upstream options as keys (model, key, ctx, provider, model_id, "
        "price_prompt, ...). Re-read on SIGHUP: providers are added, changed and removed "
        "without a restart (a file that does not parse keeps the entries in force).",
    )
    provider_breaker_failures: int = Field(
        routing.DEFAULT_BREAKER_FAILURES,
        ge=1,
        description="A routed provider that fails this many requests in a row is skipped for "
        "--provider-breaker-cooldown-secs, then probed again by one request.",
    )
    provider_breaker_cooldown_secs: float = Field(
        routing.DEFAULT_BREAKER_COOLDOWN_SECS,
        ge=0.0,
        description="Seconds a routed provider whose circuit opened is skipped.",
    )
    provider_timeout_secs: float = Field(
        routing.DEFAULT_FIRST_BYTE_TIMEOUT_SECS,
        gt=0.0,
        description="Seconds a routed provider's first output may take before the next "
        "provider is tried (an entry's timeout= overrides it).",
    )

    @field_validator("upstream", mode="before")
    @classmethod
    def _semicolon_separated(cls, value: object) -> object:
        """An upstream entry holds commas, so several in one env var are `;`-separated."""
        if isinstance(value, str):
            return [p.strip() for p in value.split(";") if p.strip()]
        return value
