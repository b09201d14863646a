"""Web search for `web_search` tools: a backend chosen by `--web-search-backend`, and the
two actions the model may take, searching and opening a page.

Backends: `searxng:URL` asks a SearxNG instance's JSON API (`/search?format=json`), an
address the operator chose, so it may be on this host; `ddgs` uses the `ddgs` metasearch
library (public search engines, no server of one's own; `pip install 'respd[web]'`). A page
the model opens is fetched like a remote image: http(s) only, every hop's address checked,
so a model cannot reach this server's network.
"""

from __future__ import annotations

import asyncio
import html
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from respd.protocol.errors import APIError, InvalidRequest
from respd.service.media.fetch import fetch_remote
from respd.service.tools.hosted.base import JSON, Outcome, Source

# Results one search gives the model, by the tool's `search_context_size`.
RESULTS_BY_CONTEXT = {"low": 3, "medium": 5, "high": 8}
PAGE_BYTES = 2 * 2**20  # the most of a page open_page reads
PAGE_CHARS = 6000  # the most of a page's text the model is shown
_TAG = re.compile(r"<(script|style|noscript)[^>]*>.*?</\1>|<[^>]+>", re.S | re.I)
_SPACE = re.compile(r"\s+")
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.S | re.I)


@dataclass(frozen=True)
class Hit:
    url: str
    title: str
    snippet: str


class SearchBackend(Protocol):
    name: str

    async def search(self, query: str, count: int, timeout: float) -> list[Hit]: ...


class SearxNG:
    """A SearxNG instance's JSON API (its settings must enable the `json` format)."""

    name = "searxng"

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    async def search(self, query: str, count: int, timeout: float) -> list[Hit]:
        async with httpx.AsyncClient(trust_env=False, timeout=timeout) as client:
            response = await client.get(
                f"{self.base_url}/search", params={"q": query, "format": "json"}
            )
        if response.status_code != 200:
            raise SearchFailed(f"the search server answered HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError:
            raise SearchFailed("the search server's answer is not JSON") from None
        results = body.get("results") if isinstance(body, dict) else None
        if not isinstance(results, list):
            raise SearchFailed("the search server's answer has no 'results' list")
        hits = [
            Hit(str(r["url"]), str(r.get("title") or r["url"]), str(r.get("content") or ""))
            for r in results
            if isinstance(r, dict) and isinstance(r.get("url"), str)
        ]
        return hits[:count]


class Ddgs:
    """The `ddgs` library's text search (blocking: run on a worker thread)."""

    name = "ddgs"

    def __init__(self) -> None:
        try:
            from ddgs import DDGS
        except ImportError:
            raise ValueError(
                "--web-search-backend ddgs needs the ddgs library: pip install 'respd[web]'"
            ) from None
        self._engine = DDGS

    async def search(self, query: str, count: int, timeout: float) -> list[Hit]:
        def run() -> list[dict[str, Any]]:
            return list(self._engine(timeout=int(max(timeout, 1))).text(query, max_results=count))

        rows = await asyncio.to_thread(run)
        return [
            Hit(str(r["href"]), str(r.get("title") or r["href"]), str(r.get("body") or ""))
            for r in rows
            if isinstance(r, dict) and isinstance(r.get("href"), str)
        ][:count]


class SearchFailed(Exception):
    pass


def backend_from_setting(setting: str | None) -> SearchBackend | None:
    """`searxng:URL`, `ddgs` or None; anything else is a ValueError naming the flag."""
    if not setting:
        return None
    if setting == "ddgs":
        return Ddgs()
    kind, _, url = setting.partition(":")
    if kind == "searxng" and url.startswith(("http://", "https://")):
        return SearxNG(url)
    raise ValueError(
        f"--web-search-backend: expected 'searxng:http(s)://HOST[:PORT]' or 'ddgs', got {setting!r}"
    )


@dataclass(frozen=True)
class WebSearchTool:
    """One request's `web_search` tool: how many results, which domains."""

    count: int
    domains: tuple[str, ...]

    @classmethod
    def from_tool(cls, entry: JSON, param: str) -> WebSearchTool:
        size = entry.get("search_context_size") or "medium"
        if size not in RESULTS_BY_CONTEXT:
            raise InvalidRequest(
                f"Invalid value for '{param}.search_context_size': expected 'low', 'medium' "
                f"or 'high', got {size!r}.",
                param=f"{param}.search_context_size",
                code="invalid_value",
            )
        filters = entry.get("filters") or {}
        domains = filters.get("allowed_domains") if isinstance(filters, dict) else None
        if domains is not None and (
            not isinstance(domains, list) or not all(isinstance(d, str) for d in domains)
        ):
            raise InvalidRequest(
                f"Invalid type for '{param}.filters.allowed_domains': expected an array of "
                "strings.",
                param=f"{param}.filters.allowed_domains",
                code="invalid_type",
            )
        cleaned = tuple(_domain(d) for d in domains or [] if _domain(d))
        return cls(RESULTS_BY_CONTEXT[size], cleaned)

    def admits(self, url: str) -> bool:
        if not self.domains:
            return True
        host = (urllib.parse.urlsplit(url).hostname or "").lower()
        return any(host == d or host.endswith("." + d) for d in self.domains)


def _domain(value: str) -> str:
    value = value.strip().lower()
    if "://" in value:
        value = urllib.parse.urlsplit(value).hostname or ""
    return value.strip("./")


async def search(
    backend: SearchBackend, tool: WebSearchTool, query: str, timeout: float
) -> Outcome:
    """A `search` action: the hits as the model's text and the item's sources."""
    query = query.strip()
    if not query:
        return Outcome.failure("the search query is empty", action=_search_action(query, []))
    try:
        async with asyncio.timeout(timeout):
            hits = await backend.search(query, tool.count * (3 if tool.domains else 1), timeout)
    except TimeoutError:
        return Outcome.failure(
            f"the search took longer than {timeout:g} seconds", action=_search_action(query, [])
        )
    except (SearchFailed, httpx.HTTPError, OSError) as exc:
        return Outcome.failure(f"web search failed ({exc})", action=_search_action(query, []))
    hits = [h for h in hits if tool.admits(h.url)][: tool.count]
    sources = [Source("url", h.url, h.title, h.snippet) for h in hits]
    if hits:
        lines = [f"[{i}] {h.title}\n{h.url}\n{h.snippet}" for i, h in enumerate(hits, 1)]
        text = f"Web results for {query!r}:\n\n" + "\n\n".join(lines)
    else:
        text = f"No web results for {query!r}."
    return Outcome("completed", text, {"action": _search_action(query, hits)}, sources)


def _search_action(query: str, hits: list[Hit]) -> JSON:
    return {
        "type": "search",
        "query": query,
        "queries": [query],
        "sources": [{"type": "url", "url": h.url} for h in hits],
    }


async def open_page(tool: WebSearchTool, url: str, timeout: float) -> Outcome:
    """An `open_page` action: the page's text, fetched under the remote-address policy."""
    action = {"type": "open_page", "url": url}
    if not tool.admits(url):
        return Outcome.failure(f"{url} is not in the allowed domains", action=action)
    try:
        body, content_type, final = await fetch_remote(
            url, "url", limit=PAGE_BYTES, timeout=timeout, what="page"
        )
    except APIError as exc:
        return Outcome.failure(exc.message.removeprefix("Invalid 'url': "), action=action)
    text = body.decode("utf-8", "replace")
    title = url
    if "html" in content_type or text.lstrip().startswith("<"):
        found = _TITLE.search(text)
        title = html.unescape(found.group(1)).strip() if found else url
        text = html.unescape(_TAG.sub(" ", text))
    text = _SPACE.sub(" ", text).strip()[:PAGE_CHARS]
    source = Source("url", final, title, text[:500])
    return Outcome("completed", f"{title}\n{final}\n\n{text}", {"action": action}, [source])
