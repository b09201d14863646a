"""A recording reverse proxy between the clients under test and respd.

Each client gets its own base URL, `http://127.0.0.1:PORT/c/<client>/v1`; the proxy strips
the prefix, forwards the request unchanged to respd, streams the answer back as it arrives,
and keeps the request (method, path, JSON body) under the client and the flow running at
the time. The suite uses the record to check which endpoints a client really called, and
saves it as the fixtures the fast unit tests replay."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.support.servers import free_port

# The state key of a server whose answers become fixtures: sealed items a client hands back
# (compaction, encrypted reasoning) open again when the unit tests replay them.
FIXTURE_STATE_KEY = "respd client fixtures"
FIXTURES = Path(__file__).with_name("fixtures")

# The first object id in an answer: a JSON object's own, or the response in the first event.
_ID = re.compile(rb'"id"\s*:\s*"((?:resp|conv|file|msg|fc)[-_][A-Za-z0-9_-]+)"')
_CALL_ID = re.compile(rb'"call_id"\s*:\s*"([^"]+)"')
# Hop-by-hop and length headers: the proxy re-frames the body, so these must not be copied.
_DROP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


@dataclass
class Captured:
    client: str
    flow: str
    method: str
    path: str
    query: str
    status: int
    body: Any  # the decoded JSON body; None for bodies that are not JSON
    created: str | None = None  # the id of the object the answer carries, first in it
    calls: list[str] = field(default_factory=list)  # the answer's tool-call ids, in order


@dataclass
class CaptureProxy:
    """The proxy's state: where it forwards to, what it has seen, and the current flow."""

    target: str
    port: int = field(default_factory=free_port)
    flow: str = ""
    requests: list[Captured] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def base_url(self, client: str) -> str:
        return f"http://127.0.0.1:{self.port}/c/{client}/v1"

    def seen(self, client: str, flow: str) -> list[Captured]:
        with self._lock:
            return [r for r in self.requests if r.client == client and r.flow == flow]

    def _record(self, item: Captured) -> None:
        with self._lock:
            self.requests.append(item)


def _json_or_none(raw: bytes, content_type: str, encoding: str) -> Any:
    if encoding or "json" not in content_type:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _app(proxy: CaptureProxy) -> Starlette:
    upstream = httpx.AsyncClient(base_url=proxy.target, timeout=httpx.Timeout(300, connect=10))

    async def forward(request: Request) -> Response:
        client = request.path_params["client"]
        rest = "/" + request.path_params["rest"]
        raw = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        outgoing = upstream.build_request(
            request.method, rest, params=request.url.query, headers=headers, content=raw
        )
        answer = await upstream.send(outgoing, stream=True)
        record = Captured(
            client=client,
            flow=proxy.flow,
            method=request.method,
            path=rest,
            query=request.url.query,
            status=answer.status_code,
            body=_json_or_none(
                raw,
                request.headers.get("content-type", ""),
                request.headers.get("content-encoding", ""),
            ),
        )
        proxy._record(record)

        async def relay() -> AsyncIterator[bytes]:
            seen = b""
            async for chunk in answer.aiter_raw():
                seen += chunk
                yield chunk
            if m := _ID.search(seen):
                record.created = m.group(1).decode()
            for m in _CALL_ID.finditer(seen):
                if (call := m.group(1).decode()) not in record.calls:
                    record.calls.append(call)

        out_headers = {k: v for k, v in answer.headers.items() if k.lower() not in _DROP}
        return StreamingResponse(
            relay(),
            status_code=answer.status_code,
            headers=out_headers,
            background=BackgroundTask(answer.aclose),
        )

    methods = ["GET", "POST", "DELETE", "PUT", "PATCH"]
    return Starlette(routes=[Route("/c/{client}/{rest:path}", forward, methods=methods)])


class RunningProxy:
    """The proxy served by uvicorn on a thread of the test process."""

    def __init__(self, target: str) -> None:
        self.state = CaptureProxy(target=target)
        config = uvicorn.Config(
            _app(self.state), host="127.0.0.1", port=self.state.port, log_level="warning"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.run(self._server.serve())

    def __enter__(self) -> CaptureProxy:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the capture proxy did not start")
            time.sleep(0.05)
        return self.state

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def save_fixtures(state: CaptureProxy) -> None:
    """The JSON request bodies each flow sent, for the unit tests to replay."""
    by_flow: dict[tuple[str, str], list[dict[str, object]]] = {}
    for r in state.requests:
        upload = r.path == "/v1/files"  # multipart: replayed as an upload of its own
        if r.method != "POST" or not r.flow or (r.body is None and not upload):
            continue
        item = {"path": r.path, "body": r.body, "created": r.created, "calls": r.calls}
        by_flow.setdefault((r.client, r.flow), []).append(item)
    for (client, name), items in by_flow.items():
        path = FIXTURES / client / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(items, indent=2, ensure_ascii=False) + "\n")
