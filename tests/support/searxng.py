"""A server speaking SearxNG's JSON search API on 127.0.0.1, for web search tests.

It answers `GET /search?q=...&format=json` as a SearxNG instance does (`query`, `results`
with `url`, `title`, `content`, `engine`), from the pages it was given, and records the
queries it was asked. A plain threaded HTTP server, so a respd in another process (or the
test's own event loop) can reach it while the test blocks.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Page:
    url: str
    title: str
    content: str


@dataclass
class SearxNG:
    url: str  # the instance's base URL, as `--web-search-backend searxng:URL` takes it
    queries: list[str] = field(default_factory=list)


@contextmanager
def searxng(pages: list[Page], *, status: int = 200) -> Iterator[SearxNG]:
    """Serve `pages` as every query's results (`status` other than 200: answer that)."""
    state = SearxNG("")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urllib.parse.urlsplit(self.path)
            params = urllib.parse.parse_qs(parts.query)
            if parts.path != "/search" or params.get("format") != ["json"]:
                self.send_error(404)
                return
            query = params.get("q", [""])[0]
            state.queries.append(query)
            results = [
                {"url": p.url, "title": p.title, "content": p.content, "engine": "test"}
                for p in pages
            ]
            body = json.dumps(
                {"query": query, "number_of_results": len(results), "results": results}
            )
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    # shutdown() waits out one poll: the default half second would be most of a test's time
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
