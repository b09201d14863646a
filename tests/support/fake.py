"""The in-process app over the package's `FakeEngine` (the unit suite's, no model)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.support.sdk_types import EVENT_ADAPTER, strict_response

FAKE_MODEL = "fake-model"


async def created(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    """POST /v1/responses for the fake model; the 200 answer, checked with the SDK's type."""
    r = await http.post("/v1/responses", json={"model": FAKE_MODEL, **body})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    strict_response(data)
    return data


async def streamed(http: httpx.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST /v1/responses with `stream: true`; every event, each checked with the SDK's type."""
    events = []
    async with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                EVENT_ADAPTER.validate_python(event)
                events.append(event)
    return events
