"""`/v1/chat/completions` route."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from respd.api.body import parse_body
from respd.api.identity import owner_of
from respd.api.quotas import stream_slot
from respd.api.streaming import DeltaFrames, EventStreamResponse, sse_frame, until_disconnect
from respd.protocol.chat import ChatCompletionRequest
from respd.protocol.errors import APIError, ServerError, UpstreamFailed
from respd.protocol.wire import wire
from respd.service.chat.service import ChatResult, ChatService, PreparedChat, ToolCallDelta
from respd.service.generation.output import ReasoningDelta

router = APIRouter()


def _error(result: ChatResult) -> APIError:
    if result.status is not None:
        return UpstreamFailed(result.error or "", result.status)
    status = 503 if result.error_code == "server_shutting_down" else 500
    return ServerError(result.error or "", code=result.error_code, status_code=status)


async def _complete(service: ChatService, prepared: PreparedChat) -> ChatResult:
    result = ChatResult()
    async for item in service.generate(prepared):
        if isinstance(item, ChatResult):
            result = item
    return result


@router.post("/v1/chat/completions")
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(request: Request) -> Response:
    service: ChatService = request.app.state.chat
    body = await parse_body(request, ChatCompletionRequest)
    if body.stream:
        with stream_slot(request) as release:
            return await _stream(request, service, body, release)
    prepared = await service.prepare(body, owner_of(request))
    result = await until_disconnect(request, _complete(service, prepared))
    if result.error is not None:
        raise _error(result)
    return JSONResponse(wire(service.completion(prepared, result)))


async def _stream(
    request: Request,
    service: ChatService,
    body: ChatCompletionRequest,
    release: Callable[[], None],
) -> EventStreamResponse:
    prepared = await service.prepare(body, owner_of(request))
    stream = service.generate(prepared)  # admission errors (503) surface before any SSE

    async def frames() -> AsyncIterator[bytes]:
        yield sse_frame(wire(service.chunk(prepared, delta={"role": "assistant", "content": ""})))
        # Plain text deltas (the bulk of a stream) from a template of this stream's chunk.
        text = DeltaFrames(wire(service.chunk(prepared, delta={"content": DeltaFrames.TEXT})))
        async with aclosing(stream):
            async for item in stream:
                if isinstance(item, ChatResult) and item.error is not None:
                    # The stream has begun: the error is its last event, as OpenAI sends one.
                    yield sse_frame(_error(item).body())
                elif isinstance(item, ChatResult):
                    yield sse_frame(
                        wire(service.chunk(prepared, delta={}, finish_reason=item.finish_reason))
                    )
                    if prepared.include_usage:
                        yield sse_frame(wire(service.chunk(prepared, usage=service.usage(item))))
                elif isinstance(item, ToolCallDelta):
                    yield sse_frame(wire(service.chunk(prepared, delta=item.as_delta())))
                elif isinstance(item, ReasoningDelta):
                    delta = {"reasoning_content": item.text}  # the vLLM / llama-server field
                    yield sse_frame(wire(service.chunk(prepared, delta=delta)))
                elif item.logprobs is None:
                    yield text.frame(item.text)
                else:
                    chunk = service.chunk(
                        prepared, delta={"content": item.text}, logprobs=item.logprobs
                    )
                    yield sse_frame(wire(chunk))
        yield sse_frame("[DONE]")

    return EventStreamResponse(
        frames(), keepalive=request.app.state.sse_keepalive, on_close=release
    )
