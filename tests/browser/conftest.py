"""Browser fixtures: real respd servers, and Debian's Chromium driven by Playwright.

One server per flavour for the whole session (each start loads the model): the playground's
own (answers capped short), one that asks for an API key, one started with --no-ui. Each
test gets a fresh browser context (its own localStorage) and leaves a screenshot of the page
under its tmp_path, whatever the outcome."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, ViewportSize, sync_playwright

from tests.support.browser import CHROMIUM_ARGS, chromium_path
from tests.support.mcp_server import McpTestServer, mcp_server
from tests.support.servers import RespdServer, start_server

# Answers that set no cap stop here: the tests read how a turn is drawn, not a long answer.
CAP = ("--max-output-tokens", "32")
API_KEY = "sk-playground-right"


def _server(tmp: Path, *args: str) -> Iterator[RespdServer]:
    srv = start_server(tmp, "--data-dir", str(tmp / "data"), *CAP, *args, preset="small")
    yield srv
    srv.stop()
    srv.assert_no_5xx()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    # MCP servers on 127.0.0.1 allowed: the test MCP server's tools are drawn as cards.
    yield from _server(tmp_path_factory.mktemp("respd-ui"), "--mcp-allowed-hosts", "127.0.0.1")


@pytest.fixture(scope="module")
def mcp() -> Iterator[McpTestServer]:
    with mcp_server() as running:
        yield running


@pytest.fixture(scope="session")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    yield from _server(tmp_path_factory.mktemp("respd-ui-key"), "--api-key", API_KEY)


@pytest.fixture(scope="session")
def no_ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    yield from _server(tmp_path_factory.mktemp("respd-no-ui"), "--no-ui")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Playwright's sync API runs an event loop of its own while it is open: closed with the
    module, so that the async tests of a whole-tree run that come after it get theirs."""
    path = chromium_path()
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(path), args=list(CHROMIUM_ARGS))
        yield chromium
        chromium.close()


@pytest.fixture()
def viewport() -> ViewportSize:
    return {"width": 1280, "height": 900}


@pytest.fixture()
def page(browser: Browser, viewport: ViewportSize, tmp_path: Path) -> Iterator[Page]:
    context = browser.new_context(viewport=viewport)
    context.set_default_timeout(60_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
    context.close()
    assert not errors, f"uncaught errors in the page: {errors}"
