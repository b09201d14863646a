"""`/v1/chat/completions` route."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from respd.api.body import parse_body
from respd.api.identity import owner_of
from respd.api.providers import provider_headers
from respd.api.quotas import stream_slot
from respd.api.streaming import (
    DeltaFrames,
    EventStreamResponse,
    after_wait,
    sse_frame,
    until_disconnect,
)
from respd.protocol.chat import ChatCompletionRequest
from respd.protocol.errors import ServerError
from respd.protocol.wire import wire
from respd.service.chat.service import ChatService, TextChunk

router = APIRouter()
log = logging.getLogger(__name__)
BROKEN = "The server had an error while processing your request."


@router.post("/v1/chat/completions")
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(request: Request) -> Response:
    service: ChatService = request.app.state.chat
    body = await parse_body(request, ChatCompletionRequest)
    if body.stream:
        models = request.app.state.models
        with stream_slot(request) as release:
            if models.needs_load(body.model):  # the stream starts, and keeps alive, meanwhile
                return after_wait(
                    request,
                    lambda: models.ready(body.model),
                    lambda: _stream(request, service, body, lambda: None),
                    lambda exc: sse_frame(exc.body()) + sse_frame("[DONE]"),
                    on_close=release,
                )
            return await _stream(request, service, body, release)
    prepared = await service.prepare(body, owner_of(request))
    completion = await until_disconnect(request, service.complete(prepared))
    answer = wire(completion)
    return JSONResponse(answer, headers=provider_headers(answer))


async def _stream(
    request: Request,
    service: ChatService,
    body: ChatCompletionRequest,
    release: Callable[[], None],
) -> EventStreamResponse:
    prepared = await service.prepare(body, owner_of(request))
    stream = service.stream(prepared)  # admission errors (503) surface before any SSE

    async def frames() -> AsyncIterator[bytes]:
        async with aclosing(stream):
            try:
                # Plain text chunks (the bulk of a stream) from a template of its chunk.
                text = DeltaFrames(wire(service.text_chunk(prepared, DeltaFrames.TEXT)))
                async for item in stream:
                    if isinstance(item, TextChunk):
                        yield text.frame(item.text)
                    elif isinstance(item, dict):
                        yield sse_frame(item)
                    else:
                        yield sse_frame(wire(item))
            except Exception:  # never a cut: the error as OpenAI streams one, then the end
                log.exception("a chat completion stream broke")
                yield sse_frame(ServerError(BROKEN, code="server_error").body())
        yield sse_frame("[DONE]")

    return EventStreamResponse(
        frames(), keepalive=request.app.state.sse_keepalive, on_close=release
    )
