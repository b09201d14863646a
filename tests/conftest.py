"""Test fixtures: a real `respd serve` on 127.0.0.1 with the embedded model, driven by the
real `openai` SDK. Servers are subprocesses, exactly as a user starts them."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

from tests.pg import fresh_schema

MODEL_ID = "smollm2-135m-instruct"
_5XX = re.compile(r'" (5\d\d) ')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RespdServer:
    """A running `respd serve` subprocess and its log."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kwargs: object) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.base_url + "/v1", api_key="sk-test", max_retries=0, **kwargs
        )

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base_url + "/v1", api_key="sk-test", max_retries=0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def assert_no_5xx(self, *, allow_503: bool = False) -> None:
        """No 5xx answers and no tracebacks (503 overload answers only where a test asks)."""
        bad = [
            line
            for line in self.log().splitlines()
            if (m := _5XX.search(line)) and not (allow_503 and m.group(1) == "503")
        ]
        assert not bad, "server answered with 5xx:\n" + "\n".join(bad)
        assert "Traceback" not in self.log(), self.log()[-4000:]


def start_server(tmp_dir: Path, *args: str, env: dict[str, str] | None = None) -> RespdServer:
    port = free_port()
    log_path = tmp_dir / f"respd-{port}.log"
    cmd = [sys.executable, "-m", "respd", "serve", "--port", str(port), *args]
    full_env = {**os.environ, **(env or {})}
    log_file = log_path.open("wb")
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=full_env)
    server = RespdServer(port, proc, log_path, list(args))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"respd exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(server.base_url + "/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"respd did not become healthy:\n{server.log()}")


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    """The shared server: default model, a 2048-token window so overflow tests stay cheap."""
    srv = start_server(tmp_path_factory.mktemp("respd"), "--ctx-size", "2048", "--threads", "2")
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


# -- stateful servers (issue 3): one per store, each on its own data dir ----------------------


@pytest.fixture(scope="session", params=["sqlite", "memory", "postgresql"])
def stateful_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RespdServer]:
    """A server per store kind; tests using it run against each (postgresql: a schema of
    its own in the test database, see tests/pg.py)."""
    tmp = tmp_path_factory.mktemp(f"respd-{request.param}")
    with ExitStack() as exits:
        store = request.param
        if store == "postgresql":
            store = exits.enter_context(fresh_schema())
        srv = start_server(
            tmp,
            "--store",
            store,
            "--data-dir",
            str(tmp / "data"),
            "--ctx-size",
            "2048",
            "--threads",
            "2",
        )
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


# -- tool-template servers (issue 4): the default model with a tool-capable template ------

TEMPLATES = Path(__file__).parent / "templates"
TOOL_FAMILIES = ("qwen", "llama3", "mistral")


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
        "--ctx-size",
        "2048",
        "--threads",
        "2",
        "--chat-template",
        str(TEMPLATES / f"{family}.jinja"),
    )
    yield srv
    srv.stop()
    srv.assert_no_5xx()
