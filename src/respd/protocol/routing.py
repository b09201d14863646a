"""The `provider` object of a create body (the reference gateway's routing and fallback
config, in OpenRouter's shape): which providers of a routed model to try, in what order."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    # A misspelt preference would silently route elsewhere: unknown fields are a 400.
    model_config = ConfigDict(extra="forbid")


class MaxPrice(_Strict):
    """USD per million tokens."""

    prompt: float | None = Field(None, ge=0)
    completion: float | None = Field(None, ge=0)


class ProviderPreferences(_Strict):
    order: list[str] | None = None
    allow_fallbacks: bool = True
    only: list[str] | None = None
    ignore: list[str] | None = None
    sort: Literal["latency", "throughput", "price"] | None = None
    require_parameters: bool = False
    max_price: MaxPrice | None = None


class RoutingFields(BaseModel):
    """What a Responses or Chat body carries for routing."""

    provider: ProviderPreferences | None = None
