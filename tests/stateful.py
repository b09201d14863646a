"""Helpers for the store/chaining/background tests, built on `tests/sdk_types.py`."""

from __future__ import annotations

from typing import Any

import httpx
from openai.types.responses import Response

from tests import sdk_types
from tests.servers import MODEL_ID

LONG_PROMPT = "Count from 1 to 1000, separated by commas."


def strict(response: Any) -> Response:
    """Strictly re-validate an SDK object (the SDK builds them leniently) as a `Response`."""
    return sdk_types.strict_response(response if isinstance(response, dict) else response.to_dict())


def strict_event(event: Any) -> Any:
    return sdk_types.strict_event(event if isinstance(event, dict) else event.to_dict())


def create(client: Any, text: Any = "Say hi.", **kw: Any) -> Response:
    kw.setdefault("max_output_tokens", 6)
    kw.setdefault("temperature", 0)
    return strict(client.responses.create(model=MODEL_ID, input=text, **kw))


def engine_stats(base_url: str) -> dict[str, int]:
    stats: dict[str, int] = httpx.get(base_url + "/health", timeout=10).json()["engine"]
    return stats
