"""Unit fixtures: the real app over the package's `FakeEngine`, in process, no model.

The official `openai` SDK talks to the app through httpx's ASGI transport, so requests
and every event are still validated by the SDK's own types."""

from __future__ import annotations

import gc
import os
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pytest

# Each xdist worker imports the whole package and the SDK's types (thousands of long-lived
# pydantic objects) before its first test; with CPython's default thresholds (700, 10, 10)
# the collector rescans them over and over, 10-15% of a worker's start. Here the young
# generation holds 50,000 objects and the older ones are collected a fifth as often. Tests
# that need a collection call gc.collect() themselves.
gc.set_threshold(50_000, 50, 50)

if TYPE_CHECKING:  # imported where used: xdist's controller process loads this file, runs no test
    import httpx
    import openai
    from fastapi import FastAPI

    from respd.engines.fake import FakeEngine
    from tests.support.mcp_server import McpTestServer


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent under `-p no:xdist`
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: three workers more than the cores, to compute while the `waits` tests
    sleep (on two cores: 26 s with three workers, 24 s with five; six are no faster, each
    worker spending 2.5 CPU-seconds on collection)."""
    return (os.cpu_count() or 1) + 3


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Deals the tests marked `waits` out to the heads of the shares xdist's `worksteal`
    hands its workers first (equal contiguous slices, in worker order), so that each worker
    sleeps through some deadlines while the others compute; a worker left with all of
    them would finish long after the rest. Without xdist they simply run first."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    waits = [item for item in items if item.get_closest_marker("waits")]
    rest = [item for item in items if not item.get_closest_marker("waits")]
    ordered: list[pytest.Item] = []
    left = len(items)
    for worker in range(workers):
        share = left // (workers - worker)  # what worksteal's first split gives this worker
        dealt = waits[worker::workers]
        take = max(share - len(dealt), 0)
        ordered += dealt + rest[:take]
        rest = rest[take:]
        left -= share
    items[:] = ordered + rest


@pytest.fixture()
def engine() -> FakeEngine:
    from respd.engines.fake import FakeEngine
    from tests.support.fake import FAKE_MODEL

    return FakeEngine(model_id=FAKE_MODEL)


@pytest.fixture()
def app(engine: FakeEngine) -> FastAPI:
    from respd.api.app import create_app
    from respd.store import MemoryStore

    return create_app(engine, MemoryStore())


@pytest.fixture()
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    import httpx

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://respd.test") as client:
        yield client


@pytest.fixture()
def sdk(http: httpx.AsyncClient) -> openai.AsyncOpenAI:
    import openai

    return openai.AsyncOpenAI(
        base_url="http://respd.test/v1", api_key="sk-test", http_client=http, max_retries=0
    )


@pytest.fixture(scope="session")
def mcp_test_server() -> Iterator[McpTestServer]:
    """The `mcp` SDK's own server on 127.0.0.1 (a subprocess), one per worker: starting one
    costs more than most tests that use it."""
    from tests.support.mcp_server import mcp_server

    with mcp_server() as running:
        yield running
