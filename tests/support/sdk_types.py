"""Validation helpers built on the `openai` SDK's own pydantic types (never our idea of a shape)."""

from __future__ import annotations

from typing import Any

from openai.types.responses import (
    CompactedResponse,
    Response,
    ResponseInputMessageItem,
    ResponseStreamEvent,
)
from pydantic import TypeAdapter

EVENT_ADAPTER: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)

# The 31 fields the Open Responses `ResponseResource` schema requires on every response.
REQUIRED_RESPONSE_FIELDS = [
    "id",
    "object",
    "created_at",
    "completed_at",
    "status",
    "incomplete_details",
    "model",
    "previous_response_id",
    "instructions",
    "output",
    "error",
    "tools",
    "tool_choice",
    "truncation",
    "parallel_tool_calls",
    "text",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "top_logprobs",
    "temperature",
    "reasoning",
    "usage",
    "max_output_tokens",
    "max_tool_calls",
    "store",
    "background",
    "service_tier",
    "metadata",
    "safety_identifier",
    "prompt_cache_key",
]


def strict_response(body: dict[str, Any]) -> Response:
    """Validate a wire response strictly and check every required field is present."""
    missing = [f for f in REQUIRED_RESPONSE_FIELDS if f not in body]
    assert not missing, f"response lacks required fields: {missing}"
    if body["usage"] is not None:
        usage = body["usage"]
        assert "cached_tokens" in usage["input_tokens_details"]
        assert "reasoning_tokens" in usage["output_tokens_details"]
    return Response.model_validate(body, strict=False)


def strict_event(body: dict[str, Any]) -> ResponseStreamEvent:
    event = EVENT_ADAPTER.validate_python(body)
    assert event.type == body["type"]
    return event


def strict_compacted(
    body: dict[str, Any],
) -> tuple[CompactedResponse, list[ResponseInputMessageItem]]:
    """A `/responses/compact` body: the SDK's `CompactedResponse` for all of it but the
    user messages it keeps, which are validated as the SDK types a stored input message
    (its output-item union holds assistant messages only)."""
    output = body["output"]
    kept = [o for o in output if o.get("type") == "message" and o.get("role") == "user"]
    rest = [o for o in output if o not in kept]
    compacted = CompactedResponse.model_validate({**body, "output": rest})
    return compacted, [ResponseInputMessageItem.model_validate(m) for m in kept]
