"""A turn made ready without output (`generate: false`, `prompt_cache_options.prewarm`).

The request is prepared exactly as for a generated response (same checks, same prompt),
the engine puts the prompt in its cache without sampling a token, and the response ends
`completed` with no output items. Its state is kept as any response's (stored, or on the
socket), so a later turn that continues it with `previous_response_id` finds both its
history and its prompt's KV ready: that turn's `cached_tokens` counts what was warmed.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from openai.types.responses import ResponseStreamEvent

from respd.engines.base import EngineBusy
from respd.protocol.errors import APIError
from respd.protocol.responses import CreateResponseRequest
from respd.service.generation.output import Usage
from respd.service.responses.events import ResponseEventMachine
from respd.service.responses.runner import PreparedResponse, ResponseRunner

RETRY_AFTER_SECONDS = 1


def wants_prewarm(req: CreateResponseRequest) -> bool:
    """`prompt_cache_options.prewarm: true` overrides `generate` to false."""
    options = req.prompt_cache_options or {}
    return options.get("prewarm") is True


async def prewarm(
    runner: ResponseRunner, req: CreateResponseRequest, owner: str
) -> tuple[PreparedResponse, ResponseEventMachine, AsyncGenerator[ResponseStreamEvent, None]]:
    """Prepare `req`, warm the engine's cache with its prompt, and return the turn, its
    machine and its events (`created`, `in_progress`, `completed`; persisted before the
    last). A bad request raises before anything is warmed; a full engine is a 503."""
    prepared = await runner.prepare(req, owner)
    generation = prepared.ready
    if runner.runs.draining:
        raise _unavailable("The server is shutting down; retry on another replica or shortly.")
    try:
        cached = await generation.engine.prewarm(
            generation.prompt,
            cache_key=generation.spec.cache_key,
            retain=generation.spec.retain,
        )
    except EngineBusy as exc:
        raise _unavailable(f"The server is overloaded: {exc}. Please retry shortly.") from exc
    machine = prepared.machine()
    usage = Usage(input_tokens=prepared.prompt_tokens, cached_tokens=cached)
    return prepared, machine, _events(runner, prepared, machine, usage)


async def _events(
    runner: ResponseRunner,
    prepared: PreparedResponse,
    machine: ResponseEventMachine,
    usage: Usage,
) -> AsyncGenerator[ResponseStreamEvent, None]:
    for event in machine.start():
        yield event
    final = machine.prepared(usage=usage)
    await runner.persist(prepared, machine)
    for event in final:
        yield event


def _unavailable(message: str) -> APIError:
    return APIError(
        message,
        status_code=503,
        error_type="server_error",
        code="server_is_overloaded",
        headers={"retry-after": str(RETRY_AFTER_SECONDS)},
    )
