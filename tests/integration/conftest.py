"""Integration fixtures: shared real servers (the default model), one per store kind, one
per tool-template family. Tests share them wherever they can: each start costs seconds."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest

from respd.engines.waiting import default_wait_policy
from tests.support.ordering import marked_first
from tests.support.pg import fresh_schema
from tests.support.servers import TEMPLATES, TOOL_FAMILIES, RespdServer, start_server

# The engines some tests run in this process wait for work as `respd serve` does by default
# (`--poll`), set before llama.cpp's OpenMP runtime loads. OpenMP's own default spins: two
# xdist workers' engines spinning on two cores ran ten times slower than one alone. The
# engine package applies the same default when it loads; some test modules import llama_cpp
# itself before it.
default_wait_policy()

SHARED_CAP = ("--max-output-tokens", "128")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules marked `long` first, the rest in their order. CI deals this suite's modules
    out whole, in this order, to two xdist workers (`--dist loadfile
    --no-loadscope-reorder`): a long module started last would leave one worker running it
    alone while the other sat idle."""
    marked_first(items, Path(__file__).parent, "long")


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    """The shared server: default model, a 2048-token window so overflow tests stay cheap,
    and answers that set no cap stopped at `SHARED_CAP` tokens: the tests read how an answer
    is shaped, not a long one (the default cap has its own test, on its own server)."""
    srv = start_server(tmp_path_factory.mktemp("respd"), *SHARED_CAP, preset="small")
    yield srv
    srv.stop()
    srv.assert_no_5xx()


@pytest.fixture()
def client(server: RespdServer) -> openai.OpenAI:
    return server.client()


@pytest.fixture()
def http(server: RespdServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


# -- stateful servers: one per store, each on its own data dir --------------------------------


@pytest.fixture(scope="session", params=["sqlite", "memory", "postgresql"])
def stateful_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RespdServer]:
    """A server per store kind; tests using it run against each (postgresql: a schema of
    its own in the test database, see tests/support/pg.py)."""
    tmp = tmp_path_factory.mktemp(f"respd-{request.param}")
    with ExitStack() as exits:
        store = request.param
        if store == "postgresql":
            store = exits.enter_context(fresh_schema())
        data = str(tmp / "data")
        srv = start_server(tmp, "--store", store, "--data-dir", data, *SHARED_CAP, preset="small")
        yield srv
        srv.stop()
        srv.assert_no_5xx()


@pytest.fixture()
def sclient(stateful_server: RespdServer) -> openai.OpenAI:
    return stateful_server.client()


@pytest.fixture(scope="session", autouse=True)
def _isolated_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Servers started without --data-dir keep their state under tmp, never in ~/.local."""
    previous = os.environ.get("RESPD_DATA_DIR")
    os.environ["RESPD_DATA_DIR"] = str(tmp_path_factory.mktemp("respd-data"))
    yield
    if previous is None:
        os.environ.pop("RESPD_DATA_DIR", None)
    else:
        os.environ["RESPD_DATA_DIR"] = previous


# -- tool-template servers: the default model with a tool-capable template --------------------


@pytest.fixture(scope="session", params=TOOL_FAMILIES)
def family_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RespdServer]:
    """The default model served with a tool-capable chat template of one family
    (tests/templates/<family>.jinja); the grammar keeps forced calls well-formed whatever
    the weights were trained on."""
    family = request.param
    srv = start_server(
        tmp_path_factory.mktemp(f"respd-{family}"),
        "--chat-template",
        str(TEMPLATES / f"{family}.jinja"),
        preset="small",
    )
    yield srv
    srv.stop()
    srv.assert_no_5xx()
