"""Request sampling fields → engine `SamplingParams`, with OpenAI's range checks."""

from __future__ import annotations

from dataclasses import dataclass

from respd.engines.base import SamplingParams
from respd.protocol.errors import InvalidRequest


@dataclass(frozen=True)
class SamplingDefaults:
    temperature: float = 1.0
    top_p: float = 1.0
    max_output_tokens: int | None = None


def _check_range(value: float | None, name: str, low: float, high: float) -> None:
    if value is not None and not (low <= value <= high):
        raise InvalidRequest(
            f"Invalid '{name}': expected a value between {low:g} and {high:g}, got {value:g}.",
            param=name,
            code="invalid_value",
        )


def build_sampling(
    *,
    defaults: SamplingDefaults,
    temperature: float | None,
    top_p: float | None,
    max_tokens: int | None,
    max_tokens_param: str,
    seed: int | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
) -> SamplingParams:
    _check_range(temperature, "temperature", 0.0, 2.0)
    _check_range(top_p, "top_p", 0.0, 1.0)
    _check_range(presence_penalty, "presence_penalty", -2.0, 2.0)
    _check_range(frequency_penalty, "frequency_penalty", -2.0, 2.0)
    if max_tokens is not None and max_tokens < 1:
        raise InvalidRequest(
            f"Invalid '{max_tokens_param}': integer below minimum value. Expected a value "
            f">= 1, but got {max_tokens} instead.",
            param=max_tokens_param,
            code="integer_below_min_value",
        )
    return SamplingParams(
        temperature=defaults.temperature if temperature is None else temperature,
        top_p=defaults.top_p if top_p is None else top_p,
        seed=seed,
        max_tokens=defaults.max_output_tokens if max_tokens is None else max_tokens,
        presence_penalty=presence_penalty or 0.0,
        frequency_penalty=frequency_penalty or 0.0,
    )
