"""Unit fixtures: the real app over the package's `FakeEngine`, in process, no model.

The official `openai` SDK talks to the app through httpx's ASGI transport, so requests
and every event are still validated by the SDK's own types."""

from __future__ import annotations

import gc
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.ordering import marked_first

# The suite is collected once (pytest-parallex then forks its workers from that process):
# the package and the SDK's types make thousands of long-lived pydantic objects, and with
# CPython's default thresholds (700, 10, 10) the collector rescanned them over and over,
# 10-15% of the collection. Here the young generation holds 50,000 objects and the older
# ones are collected a fifth as often. Tests that need a collection call gc.collect().
gc.set_threshold(50_000, 50, 50)

if TYPE_CHECKING:
    import httpx
    import openai
    from fastapi import FastAPI

    from respd.engines.fake import FakeEngine
    from tests.support.mcp_server import McpTestServer


@pytest.hookimpl(optionalhook=True)  # pytest-parallex's hook: absent without the plugin
def pytest_parallex_auto_num_workers(config: pytest.Config) -> int:
    """`--parallel=fork` with no count: six workers more than the cores, to compute while
    the `waits` tests sleep through deadlines and delays (a forked worker costs no
    collection of its own)."""
    return (os.cpu_count() or 1) + 6


@pytest.hookimpl(optionalhook=True)
def pytest_parallex_setup(config: pytest.Config) -> None:
    """In the collecting process, just before it forks the workers: build the SDK types
    every app builds at startup, so no worker builds them again, and move everything
    alive into the collector's permanent generation, so that no worker's collections touch
    (and so copy) the pages it shares with the others."""
    from respd.protocol.wire import build_sdk_types

    build_sdk_types()
    gc.freeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked `waits` first: the workers claim tests one at a time, and those
    sleeping through their deadlines early leave the rest to compute meanwhile, where a
    worker left with one at the end would finish long after the others."""
    marked_first(items, Path(__file__).parent, "waits")


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
