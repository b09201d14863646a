"""SDK objects → the JSON a client receives.

The `openai` SDK types timestamps (`created_at`, `completed_at`) as floats, but OpenAI sends
integers, and typed clients (Rust, Go, Java) reject a float where they declare an integer:
whole-second timestamps leave as integers."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

TIMESTAMP_KEYS = ("created_at", "completed_at", "expires_at")


def _integer_timestamps(obj: dict[str, Any]) -> dict[str, Any]:
    for key in TIMESTAMP_KEYS:
        value = obj.get(key)
        if isinstance(value, float) and value.is_integer():
            obj[key] = int(value)
    return obj


def wire(model: BaseModel) -> dict[str, Any]:
    """The wire JSON of an SDK object (the fields we set; nothing the SDK merely defaults)."""
    out = _integer_timestamps(model.model_dump(mode="json", exclude_unset=True, by_alias=True))
    nested = out.get("response")
    if isinstance(nested, dict):  # lifecycle events carry the whole response
        _integer_timestamps(nested)
    return out
