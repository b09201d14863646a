"""Client-suite fixtures: one real respd server, the recording proxy in front of it, the
npm clients installed from their lockfile, and the bookkeeping behind the matrix.

Every test is one flow of one client, marked `@pytest.mark.flow(client, name)`. A client
that cannot be installed or imported fails its flows; nothing here is skipped."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients import matrix
from tests.clients.capture import CaptureProxy, RunningProxy, save_fixtures
from tests.clients.matrix import NODE_DIR
from tests.support.servers import RespdServer, start_server

_results: dict[tuple[str, str], str] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "flow(client, name): one flow of one client")


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    srv = start_server(
        tmp_path_factory.mktemp("respd-clients"),
        "--ctx-size",
        "4096",
        "--threads",
        "2",
        "--data-dir",
        str(tmp_path_factory.mktemp("respd-clients-data")),
        # the hosted-MCP flows' server is the test's own, on this host
        "--mcp-allowed-hosts",
        "127.0.0.1",
    )
    yield srv
    srv.stop()
    srv.assert_no_5xx()


@pytest.fixture(scope="session")
def proxy(server: RespdServer) -> Iterator[CaptureProxy]:
    with RunningProxy(server.base_url) as state:
        yield state
    if os.environ.get("RESPD_RECORD_CLIENT_FIXTURES") == "1":
        save_fixtures(state)


@pytest.fixture()
def flow(request: pytest.FixtureRequest, proxy: CaptureProxy) -> Iterator[tuple[str, str]]:
    """The running flow's (client, name); the proxy files requests under it."""
    marker = request.node.get_closest_marker("flow")
    assert marker is not None, "client tests are marked with @pytest.mark.flow(client, name)"
    client, name = marker.args
    proxy.flow = name
    yield client, name
    proxy.flow = ""


@pytest.fixture()
def base_url(flow: tuple[str, str], proxy: CaptureProxy) -> str:
    return proxy.base_url(flow[0])


@pytest.fixture(scope="session")
def node_modules() -> Path:
    """The npm clients, installed exactly as the lockfile says (again when it changes)."""
    npm = shutil.which("npm")
    assert npm, "npm is not installed: the Node.js clients cannot be tested"
    stamp = NODE_DIR / "node_modules" / ".package-lock.json"
    lock = NODE_DIR / "package-lock.json"
    if not stamp.exists() or stamp.stat().st_mtime < lock.stat().st_mtime:
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True, timeout=600
        )
    return NODE_DIR / "node_modules"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    marker = item.get_closest_marker("flow")
    if marker is not None:
        key = (marker.args[0], marker.args[1])
        if report.failed:
            _results[key] = "fail"
        elif report.when == "call" and report.passed:
            _results.setdefault(key, "pass")
    return report


def _current() -> list[matrix.FlowResult]:
    return [
        matrix.FlowResult(client, name, matrix.versions(client), result)
        for (client, name), result in _results.items()
    ]


_summary: list[str] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Keep the committed matrix (and the manual's table) in step with what ran."""
    if not _results:
        return
    current = _current()
    _summary.append("client compatibility matrix (this run):\n" + matrix.render(current))
    if os.environ.get("RESPD_UPDATE_CLIENT_MATRIX") == "1":
        ran = {(r.client, r.flow) for r in current}
        kept = [r for r in matrix.load() if (r.client, r.flow) not in ran]
        matrix.save(kept + current)
        matrix.write_page(kept + current)
        _summary.append("recorded in tests/clients/matrix.json and docs/clients/compatibility.md")
        return
    committed = {(r.client, r.flow): r for r in matrix.load()}
    drift = [r for r in current if committed.get((r.client, r.flow)) != r]
    if drift:
        _summary.append(
            "the committed matrix (tests/clients/matrix.json) differs from this run for:\n"
            + "\n".join(f"  {r}" for r in drift)
            + "\nrun the client suite with RESPD_UPDATE_CLIENT_MATRIX=1 to record it"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for text in _summary:
        terminalreporter.write_line("\n" + text)
