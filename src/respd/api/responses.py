"""`/v1/responses` routes."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from respd.api.body import parse_body
from respd.api.streaming import EventStreamResponse, dump, sse_frame, until_disconnect
from respd.protocol.responses import CreateResponseRequest
from respd.service.events import ResponseEventMachine
from respd.service.responses import PreparedResponse, ResponsesService

router = APIRouter()


def _service(request: Request) -> ResponsesService:
    service: ResponsesService = request.app.state.responses
    return service


async def _collect(service: ResponsesService, prepared: PreparedResponse) -> ResponseEventMachine:
    machine = ResponseEventMachine(prepared.echo)
    async for _ in service.run(prepared, machine):
        pass
    return machine


@router.post("/v1/responses")
@router.post("/responses", include_in_schema=False)
async def create_response(request: Request) -> Response:
    service = _service(request)
    body = await parse_body(request, CreateResponseRequest)
    prepared = await service.prepare(body)
    if body.stream:

        async def frames() -> AsyncIterator[bytes]:
            async for event in service.run(prepared):
                yield sse_frame(dump(event), event.type)

        return EventStreamResponse(frames())
    machine = await until_disconnect(request, _collect(service, prepared))
    return JSONResponse(dump(machine.snapshot()))
