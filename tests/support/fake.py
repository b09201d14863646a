"""The in-process app over the package's `FakeEngine` (the unit suite's, no model)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.sdk_types import strict_response

FAKE_MODEL = "fake-model"


async def created(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    """POST /v1/responses for the fake model; the 200 answer, checked with the SDK's type."""
    r = await http.post("/v1/responses", json={"model": FAKE_MODEL, **body})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    strict_response(data)
    return data
