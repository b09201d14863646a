"""Helpers for the store/chaining/background tests, built on `tests/support/sdk_types.py`."""

from __future__ import annotations

import time
from typing import Any

import httpx
from openai.types.responses import Response

from tests.support import sdk_types
from tests.support.servers import MODEL_ID

# A job that outlasts whatever a test does to it (cancel, delete, kill): greedy, the default
# model writes "1, 2, 3, ..." to any 1,500-token cap. ("Count from 1 to 1000" it answers with
# a list of twenty, 121 tokens: over before a cancel lands on a loaded machine.)
LONG_PROMPT = "Write the numbers from 1 to 1000, separated by commas."


def strict(response: Any) -> Response:
    """Strictly re-validate an SDK object (the SDK builds them leniently) as a `Response`."""
    return sdk_types.strict_response(response if isinstance(response, dict) else response.to_dict())


def strict_event(event: Any) -> Any:
    return sdk_types.strict_event(event if isinstance(event, dict) else event.to_dict())


def create(client: Any, text: Any = "Say hi.", **kw: Any) -> Response:
    kw.setdefault("max_output_tokens", 6)
    kw.setdefault("temperature", 0)
    return strict(client.responses.create(model=MODEL_ID, input=text, **kw))


def leave_background_stream(client: Any, last: int, **kw: Any) -> list[Any]:
    """Start a streamed background count, read its events up to sequence number `last`
    (strictly validated) and hang up; the job carries on without a reader."""
    stream = client.responses.create(
        model=MODEL_ID, input=LONG_PROMPT, background=True, stream=True, temperature=0, **kw
    )
    seen = []
    for event in stream:
        seen.append(strict_event(event))
        if event.sequence_number >= last:
            break
    stream.close()
    return seen


def poll(client: Any, response_id: str, until: Any, timeout: float = 120) -> Response:
    """Retrieve `response_id` until `until(response)` holds (or fail after `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = strict(client.responses.retrieve(response_id))
        if until(got):
            return got
        time.sleep(0.05)
    raise AssertionError(f"{response_id} never reached the awaited state")


def engine_stats(base_url: str) -> dict[str, int]:
    stats: dict[str, int] = httpx.get(base_url + "/health", timeout=10).json()["engine"]
    return stats
