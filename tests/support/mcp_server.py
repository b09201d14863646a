"""A real MCP server for tests: the `mcp` SDK's own `MCPServer`, in a subprocess on 127.0.0.1,
serving streamable HTTP at `/mcp` and SSE at `/sse` from one app.

Besides the MCP endpoints it serves `/requests` (how many HTTP requests the MCP side saw, so a
test can prove no connection was made), `/fail500/mcp` (every request answered HTTP 500) and
`/elsewhere/mcp` (every request redirected to this server's `/mcp` under the name `localhost`).

Run it as `python -m tests.support.mcp_server`: it prints its port on the first line of stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse
from starlette.routing import Route

ROOT = Path(__file__).resolve().parents[2]
FACT = "The secret code of {topic} is 7491."


def build_app() -> Any:
    """The Starlette app: MCP over both transports plus the test-only routes."""
    server: MCPServer[Any] = MCPServer("respd-test", log_level="WARNING")

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> int:
        return a + b

    @server.tool(
        description="Look up a fact about a topic.",
        annotations=ToolAnnotations(read_only_hint=True),
    )
    def lookup_fact(topic: str) -> str:
        return FACT.format(topic=topic)

    @server.tool(description="The Authorization and X-Test-Header headers as received.")
    def whoami(ctx: Context) -> str:
        headers = ctx.headers or {}
        return (
            f"authorization={headers.get('authorization')} "
            f"x-test-header={headers.get('x-test-header')}"
        )

    @server.tool(description="Always fails.")
    def explode() -> str:
        raise ToolError("kaboom")

    @server.tool(description="Sleeps, then answers.")
    async def sleep(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "slept"

    streamable = server.streamable_http_app()
    sse = server.sse_app()
    seen = {"requests": 0}

    async def requests(_: Request) -> JSONResponse:
        return JSONResponse(seen)

    async def fail(_: Request) -> PlainTextResponse:
        return PlainTextResponse("broken", status_code=500)

    async def elsewhere(request: Request) -> RedirectResponse:
        # The same server under another host name: another origin to a client.
        return RedirectResponse(f"http://localhost:{request.url.port}/mcp", status_code=307)

    app = Starlette(
        routes=[
            Route("/requests", requests),
            Route("/fail500/{rest:path}", fail, methods=["GET", "POST", "DELETE"]),
            Route("/elsewhere/mcp", elsewhere, methods=["GET", "POST", "DELETE"]),
            *streamable.routes,
            *sse.routes,
        ],
        # The streamable app's lifespan runs its session manager.
        lifespan=streamable.router.lifespan_context,
    )

    async def counting(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/requests":
            seen["requests"] += 1
        await app(scope, receive, send)

    return counting


def main() -> None:
    """Bind a free port, print it, serve until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    port = parser.parse_args().port
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(build_app(), log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


@dataclass(frozen=True)
class McpTestServer:
    port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The streamable HTTP endpoint."""
        return f"{self.base}/mcp"

    @property
    def sse_url(self) -> str:
        return f"{self.base}/sse"

    @property
    def redirecting_url(self) -> str:
        """An endpoint that redirects to another origin (`localhost` for `127.0.0.1`)."""
        return f"{self.base}/elsewhere/mcp"

    @property
    def failing_url(self) -> str:
        """An endpoint that answers every request with HTTP 500."""
        return f"{self.base}/fail500/mcp"

    def requests_seen(self) -> int:
        """HTTP requests the server saw, not counting these queries."""
        return int(httpx.get(f"{self.base}/requests", timeout=5).json()["requests"])


@contextlib.contextmanager
def mcp_server(timeout: float = 20.0) -> Iterator[McpTestServer]:
    """Start the test server in a subprocess, wait until it answers, kill it on exit."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.mcp_server"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"the MCP test server did not start (printed {line!r})")
        server = McpTestServer(int(line))
        deadline = time.monotonic() + timeout
        while True:
            try:
                server.requests_seen()
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the MCP test server did not answer") from None
                time.sleep(0.05)
        yield server
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


if __name__ == "__main__":
    main()
