"""The flags of how tokens are sampled, and how many, when a request does not say."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# The sampling SmolLM2's authors recommend in its model card; its GGUF carries no
# general.sampling.* metadata. At llama-server's 0.8 the 135M model often rambles on to the
# end of its context.
EMBEDDED_MODEL_SAMPLING = {"temperature": 0.2, "top_p": 0.9}


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
        ge=1,
        description="Cap on generated tokens when a request sets none. Default: until the "
        "end-of-turn token or the context window is full.",
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
        }
        base = dict(EMBEDDED_MODEL_SAMPLING) if embedded_model else {}
        return base | {k: float(v) for k, v in given.items() if v is not None}
