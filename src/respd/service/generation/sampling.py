"""Request sampling fields → engine `SamplingParams`, with OpenAI's range checks.

Fields a request leaves out stay None: the engine applies its defaults (the server's
`--temperature`/`--top-p`, else what the model's GGUF recommends); the generation core caps
an output the request does not bound (`policy.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from respd.engines.base import SamplingParams
from respd.protocol.errors import InvalidRequest
from respd.protocol.sampling import DryFields

# llama.cpp matches a DRY breaker by its first tokens, at most 40 characters of it.
MAX_BREAKER_CHARS = 40
MAX_BREAKERS = 64


def _check_range(value: float | None, name: str, low: float, high: float) -> None:
    if value is not None and not (math.isfinite(value) and low <= value <= high):
        raise InvalidRequest(
            f"Invalid '{name}': expected a value between {low:g} and {high:g}, got {value:g}.",
            param=name,
            code="invalid_value",
        )


def build_sampling(
    *,
    temperature: float | None,
    top_p: float | None,
    max_tokens: int | None,
    max_tokens_param: str,
    seed: int | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    ignore_eos: bool | None = None,
    min_tokens: int | None = None,
    logit_bias: Mapping[str, float] | None = None,
    n_vocab: int | None = None,
    dry: DryFields | None = None,
) -> SamplingParams:
    """`logit_bias` keys are token ids as strings (JSON object keys), checked against the
    engine's `n_vocab` when it knows it."""
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
    if min_tokens is not None and min_tokens < 0:
        raise InvalidRequest(
            f"Invalid 'min_tokens': integer below minimum value. Expected a value >= 0, but "
            f"got {min_tokens} instead.",
            param="min_tokens",
            code="integer_below_min_value",
        )
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise InvalidRequest(
            f"Invalid 'min_tokens': {min_tokens} is above '{max_tokens_param}' ({max_tokens}).",
            param="min_tokens",
            code="invalid_value",
        )
    bias = {int(token): float(value) for token, value in (logit_bias or {}).items()}
    if n_vocab is not None and (outside := [t for t in bias if t >= n_vocab]):
        raise InvalidRequest(
            f"Invalid 'logit_bias': token id {min(outside)} is not in this model's vocabulary "
            f"(ids 0 to {n_vocab - 1}).",
            param="logit_bias",
            code="invalid_value",
        )
    return SamplingParams(
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        max_tokens=max_tokens,
        presence_penalty=presence_penalty or 0.0,
        frequency_penalty=frequency_penalty or 0.0,
        ignore_eos=bool(ignore_eos),
        min_tokens=min_tokens or 0,
        logit_bias=bias,
        **(check_dry(dry) if dry is not None else {}),
    )


def _at_least(value: float | None, name: str, low: float) -> None:
    if value is not None and not (math.isfinite(value) and value >= low):
        raise InvalidRequest(
            f"Invalid '{name}': expected a value >= {low:g}, got {value:g}.",
            param=name,
            code="invalid_value",
        )


def check_dry(dry: DryFields) -> dict[str, Any]:
    """A request's DRY settings (those it gives), range-checked as llama-server reads them."""
    _at_least(dry.dry_multiplier, "dry_multiplier", 0.0)
    _at_least(dry.dry_base, "dry_base", 1.0)
    _at_least(dry.dry_allowed_length, "dry_allowed_length", 1)
    _at_least(dry.dry_penalty_last_n, "dry_penalty_last_n", -1)
    breakers = dry.dry_sequence_breakers
    if breakers is not None:
        bad = [b for b in breakers if not 1 <= len(b) <= MAX_BREAKER_CHARS]
        if bad or len(breakers) > MAX_BREAKERS:
            raise InvalidRequest(
                f"Invalid 'dry_sequence_breakers': expected at most {MAX_BREAKERS} strings of "
                f"1 to {MAX_BREAKER_CHARS} characters.",
                param="dry_sequence_breakers",
                code="invalid_value",
            )
    given = {name: getattr(dry, name) for name in DryFields.model_fields}  # not a subclass's
    return {name: value for name, value in given.items() if value is not None}
