"""The flags of how tokens are sampled, and how many, when a request does not say."""

from __future__ import annotations

import json
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from respd.service.generation.policy import MIN_SPAN, REPEATS, OutputPolicy

# The sampling SmolLM2's authors recommend in its model card; its GGUF carries no
# general.sampling.* metadata. At llama-server's 0.8 the 135M model often rambles on to the
# end of its context.
# DRY at 0.8 (the strength its author recommends) lets the 135M model end far more of its
# short turns before looping; bench/runaway.py measures it.
EMBEDDED_MODEL_SAMPLING = {"temperature": 0.2, "top_p": 0.9, "dry_multiplier": 0.8}


class SamplingConfig(BaseModel):
    model_config = ConfigDict(title="Sampling")

    temperature: float | None = Field(
        None,
        ge=0.0,
        le=2.0,
        description="Sampling temperature when a request sets none. Default: what the model's "
        "GGUF metadata recommends (general.sampling.temp); for the embedded SmolLM2 0.2 (its "
        "authors' recommendation); else 0.8.",
    )
    top_p: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Nucleus sampling when a request sets none. Default: the GGUF's "
        "general.sampling.top_p; for the embedded SmolLM2 0.9; else 0.95.",
    )
    top_k: int | None = Field(
        None,
        ge=0,
        description="Top-k sampling (every request). Default: the GGUF's general.sampling.top_k, "
        "else 40.",
    )
    min_p: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Min-p sampling (every request). Default: the GGUF's "
        "general.sampling.min_p, else 0.05.",
    )
    repeat_penalty: float | None = Field(
        None,
        gt=0.0,
        description="Repetition penalty over the last 64 tokens (1 disables). Default: the "
        "GGUF's general.sampling.penalty_repeat, else 1.",
    )
    max_output_tokens: int | None = Field(
        None,
        ge=0,
        description="Cap on generated tokens when a request sets none (a request may ask "
        "for more, up to the context window); 0: no cap, until the end-of-turn token or the "
        "context window is full. Default: a quarter of each model's context window.",
    )
    dry_multiplier: float | None = Field(
        None,
        ge=0.0,
        description="DRY sampler strength when a request sets none: output that would "
        "extend a repeat of earlier output is penalized (0 disables). Default: 0.8 for the "
        "embedded SmolLM2 (measured, see the Runaway turns page); else 0, as llama-server.",
    )
    dry_base: float | None = Field(
        None, ge=1.0, description="DRY penalty growth per repeated token. Default: 1.75."
    )
    dry_allowed_length: int | None = Field(
        None,
        ge=1,
        description="Repeats up to this many tokens long are not penalized by DRY. Default: 2.",
    )
    dry_penalty_last_n: int | None = Field(
        None,
        ge=-1,
        description="Tokens DRY looks back over (-1: the whole context; 0 disables). Default: -1.",
    )
    dry_sequence_breakers: str | None = Field(
        None,
        description="A JSON array of strings that end a repeat DRY tracks. Default: "
        '["\\n", ":", "\\"", "*"].',
    )
    repetition_stop: int = Field(
        REPEATS,
        ge=0,
        description="End a turn as incomplete once the output repeats one span of at least "
        f"{MIN_SPAN} characters this many times in a row (0: never).",
    )

    @field_validator("dry_sequence_breakers")
    @classmethod
    def _breakers_json(cls, value: str | None) -> str | None:
        if value is not None:
            parsed = json.loads(value)
            if not isinstance(parsed, list) or not all(isinstance(b, str) for b in parsed):
                raise ValueError("expected a JSON array of strings")
        return value

    def output_policy(self) -> OutputPolicy:
        """How far a generation may run when its request does not say."""
        return OutputPolicy(self.max_output_tokens, self.repetition_stop)

    def dry_breakers(self) -> Sequence[str] | None:
        """The DRY sequence breakers given (None: the engine's default)."""
        return (
            None if self.dry_sequence_breakers is None else json.loads(self.dry_sequence_breakers)
        )

    def sampling_overrides(self, *, embedded_model: bool) -> dict[str, float]:
        """The sampling settings given (over the embedded model's recommendation when it
        is served), to apply over what the GGUF recommends."""
        given = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repeat_penalty": self.repeat_penalty,
            "dry_multiplier": self.dry_multiplier,
            "dry_base": self.dry_base,
            "dry_allowed_length": self.dry_allowed_length,
            "dry_penalty_last_n": self.dry_penalty_last_n,
        }
        base = dict(EMBEDDED_MODEL_SAMPLING) if embedded_model else {}
        return base | {k: float(v) for k, v in given.items() if v is not None}
