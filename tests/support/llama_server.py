"""llama.cpp's own llama-server on 127.0.0.1, serving the embedded model: an upstream for
the tests of respd in front of other servers. The binary comes from RESPD_TEST_LLAMA_SERVER
(`scripts/llama-server.sh` builds it); without it the tests fail under CI and skip
elsewhere, saying how to build it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from respd.config import embedded_model_path
from respd.engines.llamacpp import cpu_advertises_amx
from tests.support.servers import free_port

ENV = "RESPD_TEST_LLAMA_SERVER"


def llama_server_binary() -> Path:
    path = os.environ.get(ENV)
    if path:
        return Path(path)
    if os.environ.get("CI"):
        pytest.fail(f"{ENV} is not set: .ci/run builds llama-server with scripts/llama-server.sh")
    pytest.skip(f'these tests need {ENV}: export {ENV}="$(scripts/llama-server.sh)"')


@contextlib.contextmanager
def llama_server(tmp: Path, alias: str) -> Iterator[int]:
    """A running llama-server serving the embedded model as `alias`; yields its port."""
    binary = llama_server_binary()
    port = free_port()
    log_path = tmp / f"llama-server-{port}.log"
    llama = subprocess.Popen(
        [
            str(binary),
            "-m", str(embedded_model_path()),
            "--host", "127.0.0.1",
            "--port", str(port),
            "-c", "4096",
            "-np", "2",
            "-t", "2",
            "--poll", "0",  # idle threads sleep, as respd's do: other suites share the cores
            "--alias", alias,
            "--jinja",
            "--no-webui",
            # ggml's AMX kernels crash under some hypervisors; respd's engine decides alike.
            "--no-repack" if cpu_advertises_amx() else "--repack",
        ],
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            assert llama.poll() is None, log_path.read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "llama-server did not start"
            time.sleep(0.2)
        yield port
    finally:
        llama.terminate()
        llama.wait(timeout=30)
