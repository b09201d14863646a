"""Helpers for the store/chaining/background tests: strict validation with the SDK's types."""

from __future__ import annotations

from typing import Any

from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.conftest import MODEL_ID

EVENT = TypeAdapter(ResponseStreamEvent)


def strict(response: Any) -> Response:
    """Re-validate an SDK object (built leniently by the SDK) as a strict `Response`."""
    data = response if isinstance(response, dict) else response.to_dict()
    return Response.model_validate(data)


def strict_event(event: Any) -> Any:
    data = event if isinstance(event, dict) else event.to_dict()
    return EVENT.validate_python(data)


def create(client: Any, text: str = "Say hi.", **kw: Any) -> Response:
    kw.setdefault("max_output_tokens", 6)
    kw.setdefault("temperature", 0)
    return strict(client.responses.create(model=MODEL_ID, input=text, **kw))


LONG_PROMPT = "Count from 1 to 1000, separated by commas."
