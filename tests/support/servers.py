"""Real `respd serve` processes on 127.0.0.1 for integration tests, driven by the real
`openai` SDK. Servers are subprocesses, exactly as a user starts them."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai

MODEL_ID = "smollm2-135m-instruct"
TEMPLATES = Path(__file__).parents[1] / "templates"
TOOL_FAMILIES = ("qwen", "llama3", "mistral")
# Named flag sets that many servers share; a test adds what it needs on top.
PRESETS: dict[str, tuple[str, ...]] = {
    # The shared server's: a 2048-token window keeps overflow tests cheap.
    "small": ("--ctx-size", "2048", "--threads", "2"),
    # A 1024-token window, for servers whose tests send short prompts.
    "compact": ("--ctx-size", "1024", "--threads", "2"),
}
_5XX = re.compile(r'" (5\d\d) ')
CONTEXT_END = "generation stopped: context end"  # what the server logs for such a turn


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
    # A turn that fills the context window fails the test that stops the server, unless
    # the test is about one.
    context_end_ok: bool = False

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
        if not self.context_end_ok:
            self.assert_no_context_end()

    def assert_no_context_end(self) -> None:
        """No turn ran until the context window was full (the runaway guards bound them)."""
        ends = [line for line in self.log().splitlines() if CONTEXT_END in line]
        assert not ends, "a turn ran to the context end:\n" + "\n".join(ends)

    def assert_no_5xx(self, *, allow_503: bool = False) -> None:
        """No 5xx answers and no tracebacks (503 overload answers only where a test asks)."""
        bad = [
            line
            for line in self.log().splitlines()
            if (m := _5XX.search(line)) and not (allow_503 and m.group(1) == "503")
        ]
        assert not bad, "server answered with 5xx:\n" + "\n".join(bad)
        assert "Traceback" not in self.log(), self.log()[-4000:]


def start_server(
    tmp_dir: Path,
    *args: str,
    preset: str | None = None,
    env: dict[str, str] | None = None,
    context_end_ok: bool = False,
    port: int | None = None,
) -> RespdServer:
    """`respd serve` with the preset's flags (if any), then `args`, once it answers /health
    (on `port`, or a free one)."""
    if preset is not None:
        args = (*PRESETS[preset], *args)
    port = port or free_port()
    log_path = tmp_dir / f"respd-{port}.log"
    cmd = [sys.executable, "-m", "respd", "serve", "--port", str(port), *args]
    # Two decode threads unless the test or the caller's environment says otherwise: the
    # suite's machines have two cores, and the server's own default (the cores less one)
    # is for hosts where other work runs beside it.
    full_env = {"RESPD_THREADS": "2", **os.environ, **(env or {})}
    log_file = log_path.open("wb")
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=full_env)
    server = RespdServer(port, proc, log_path, list(args), context_end_ok)
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


def wait_until(check: Callable[[], bool], timeout: float = 30, what: str = "a condition") -> None:
    """Poll `check` until it holds (a server's state that changes on its own time)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
