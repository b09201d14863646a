"""SDK objects → the JSON a client receives.

The `openai` SDK types timestamps (`created_at`, `completed_at`) as floats, but OpenAI sends
integers, and typed clients (Rust, Go, Java) reject a float where they declare an integer:
whole-second timestamps leave as integers."""

from __future__ import annotations

from typing import Any, get_args

from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
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


def build_sdk_types() -> None:
    """Build the validators and serializers of the SDK types respd sends. The SDK defers
    each type's build to its first use, so a fresh server's first response of each kind
    waited for it: about 40 ms for `Response` alone on an idle core, several times that
    beside running decode threads. All of them take about 0.1 s at startup."""
    events = get_args(get_args(ResponseStreamEvent)[0])
    for cls in (Response, ChatCompletion, ChatCompletionChunk, *events):
        if not cls.__pydantic_complete__:
            cls.model_rebuild()
