"""The web search backends and actions: SearxNG's JSON API (a SearxNG-protocol server on
127.0.0.1), the ddgs library's rows, allowed domains, and pages the model may not open."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from respd.protocol.errors import InvalidRequest
from respd.service.tools.hosted.web_search import (
    Ddgs,
    SearxNG,
    WebSearchTool,
    backend_from_setting,
    open_page,
    search,
)
from tests.support.searxng import Page, searxng

PAGES = [
    Page("https://docs.example.org/a", "A", "alpha text"),
    Page("https://other.example.com/b", "B", "beta text"),
    Page("https://sub.docs.example.org/c", "C", "gamma text"),
]


async def test_searxng_results_become_sources_and_the_models_text() -> None:
    tool = WebSearchTool.from_tool({"type": "web_search", "search_context_size": "low"}, "t")
    with searxng(PAGES) as server:
        outcome = await search(SearxNG(server.url), tool, "  greek letters ", 5)
    assert server.queries == ["greek letters"]
    assert outcome.status == "completed"
    assert [s["url"] for s in outcome.fields["action"]["sources"]] == [p.url for p in PAGES]
    assert "alpha text" in outcome.text and "[3] C" in outcome.text
    assert [s.ref for s in outcome.sources] == [p.url for p in PAGES]


async def test_allowed_domains_keep_other_sites_out() -> None:
    entry = {"type": "web_search", "filters": {"allowed_domains": ["https://docs.example.org"]}}
    tool = WebSearchTool.from_tool(entry, "t")
    with searxng(PAGES) as server:
        outcome = await search(SearxNG(server.url), tool, "x", 5)
    urls = [s["url"] for s in outcome.fields["action"]["sources"]]
    assert urls == ["https://docs.example.org/a", "https://sub.docs.example.org/c"]


async def test_a_failing_or_unreachable_backend_is_a_failed_outcome() -> None:
    tool = WebSearchTool.from_tool({"type": "web_search"}, "t")
    with searxng(PAGES, status=503) as server:
        failed = await search(SearxNG(server.url), tool, "x", 5)
    assert failed.status == "failed" and "HTTP 503" in failed.text
    gone = await search(SearxNG("http://127.0.0.1:9"), tool, "x", 2)
    assert gone.status == "failed" and gone.fields["action"]["query"] == "x"
    empty = await search(SearxNG("http://127.0.0.1:9"), tool, "  ", 2)
    assert empty.status == "failed" and "empty" in empty.text


async def test_the_ddgs_backend_reads_the_librarys_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, int]] = []

    class FakeDDGS:  # the library's interface, without the network
        def __init__(self, timeout: int) -> None:
            assert timeout >= 1

        def text(self, query: str, max_results: int) -> list[dict[str, Any]]:
            asked.append((query, max_results))
            return [{"title": "T", "href": "https://e.org/x", "body": "snippet"}, {"bad": 1}]

    monkeypatch.setitem(sys.modules, "ddgs", types.SimpleNamespace(DDGS=FakeDDGS))
    backend = backend_from_setting("ddgs")
    assert isinstance(backend, Ddgs)
    tool = WebSearchTool.from_tool({"type": "web_search", "search_context_size": "high"}, "t")
    outcome = await search(backend, tool, "q", 5)
    assert asked == [("q", 8)]
    assert [s.ref for s in outcome.sources] == ["https://e.org/x"]


def test_backend_settings_are_checked() -> None:
    assert backend_from_setting(None) is None
    assert isinstance(backend_from_setting("searxng:http://127.0.0.1:1"), SearxNG)
    with pytest.raises(ValueError, match="web-search-backend"):
        backend_from_setting("bing")


def test_a_bad_tool_is_a_400_naming_its_field() -> None:
    with pytest.raises(InvalidRequest) as bad:
        WebSearchTool.from_tool({"type": "web_search", "filters": {"allowed_domains": "x"}}, "t[0]")
    assert bad.value.param == "t[0].filters.allowed_domains"


async def test_a_page_on_this_host_is_not_opened() -> None:
    tool = WebSearchTool.from_tool({"type": "web_search"}, "t")
    with searxng(PAGES) as server:
        outcome = await open_page(tool, f"{server.url}/search?q=x&format=json", 5)
    assert outcome.status == "failed" and "loopback" in outcome.text
    assert server.queries == []  # no request reached it
    assert outcome.fields["action"] == {
        "type": "open_page",
        "url": f"{server.url}/search?q=x&format=json",
    }
