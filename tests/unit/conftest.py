"""Unit fixtures: the real app over the package's `FakeEngine`, in process, no model.

The official `openai` SDK talks to the app through httpx's ASGI transport, so requests
and every event are still validated by the SDK's own types."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from fastapi import FastAPI

from respd.api.app import create_app
from respd.engines.fake import FakeEngine
from respd.store import MemoryStore
from tests.support.fake import FAKE_MODEL


@pytest.fixture()
def engine() -> FakeEngine:
    return FakeEngine(model_id=FAKE_MODEL)


@pytest.fixture()
def app(engine: FakeEngine) -> FastAPI:
    return create_app(engine, MemoryStore())


@pytest.fixture()
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://respd.test") as client:
        yield client


@pytest.fixture()
def sdk(http: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url="http://respd.test/v1", api_key="sk-test", http_client=http, max_retries=0
    )
