"""Sampling extensions a request body may carry beyond OpenAI's, under the names local
servers (llama-server, vLLM) give them."""

from __future__ import annotations

from pydantic import BaseModel


class DryFields(BaseModel):
    """llama.cpp's DRY ("don't repeat yourself") sampler, as llama-server names it; ranges
    are checked where sampling is built, so a bad value is a 400 naming its field."""

    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
