"""A real uvicorn server on 127.0.0.1 inside the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import uvicorn


@contextlib.asynccontextmanager
async def serving(app: Any, **config: Any) -> AsyncIterator[int]:
    """Serve `app` (uvicorn `Config` options in `config`) on a free port; yield the port."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning", **config)
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def serving_each(app: Any, protocols: dict[str, Any], **config: Any) -> AsyncIterator[Ports]:
    """One server per HTTP protocol class in `protocols` (name → class), started together;
    yields their ports by name."""
    async with contextlib.AsyncExitStack() as stack:
        ports = await asyncio.gather(
            *(
                stack.enter_async_context(serving(app, http=cls, **config))
                for cls in protocols.values()
            )
        )
        yield Ports(zip(protocols, ports, strict=True))


class Ports(dict[str, int]):
    """Ports of the same app behind several HTTP protocols."""

    async def each(self, case: Callable[[int], Awaitable[None]]) -> None:
        """Runs `case` against every port at once: the deadlines the cases wait out overlap,
        and a failure names the protocol."""
        results = await asyncio.gather(
            *(case(port) for port in self.values()), return_exceptions=True
        )
        for name, result in zip(self, results, strict=True):
            if isinstance(result, BaseException):
                raise AssertionError(f"over {name}: {result!r}") from result
