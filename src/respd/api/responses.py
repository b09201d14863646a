"""`/v1/responses` routes: create, retrieve (or replay a background stream), delete, cancel,
input items and input token counts."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from openai.types.responses import ResponseStreamEvent

from respd.api.body import parse_body
from respd.api.identity import owner_of
from respd.api.query import include_param
from respd.api.quotas import stream_slot
from respd.api.streaming import DeltaFrames, EventStreamResponse, sse_frame, until_disconnect
from respd.protocol.errors import UpstreamFailed
from respd.protocol.input_tokens import InputTokensRequest
from respd.protocol.responses import CreateResponseRequest
from respd.protocol.wire import wire
from respd.service.responses.background import BackgroundJobs
from respd.service.responses.compaction import Compactor, CompactRequest, compaction_turn
from respd.service.responses.events import ResponseEventMachine
from respd.service.responses.service import PreparedResponse, ResponsesService
from respd.service.responses.stored import StoredResponses

router = APIRouter()


def _service(request: Request) -> ResponsesService:
    service: ResponsesService = request.app.state.responses
    return service


def _jobs(request: Request) -> BackgroundJobs:
    jobs: BackgroundJobs = request.app.state.background
    return jobs


def _stored(request: Request) -> StoredResponses:
    stored: StoredResponses = request.app.state.stored
    return stored


def _sse(
    request: Request, events: AsyncGenerator[dict[str, Any], None], release: Callable[[], None]
) -> EventStreamResponse:
    """SSE frames of `events`; closing the response closes `events` at once and gives back
    the stream slot (`release`) taken before any work started."""

    async def frames() -> AsyncIterator[bytes]:
        async with aclosing(events):
            async for event in events:
                yield sse_frame(event, event["type"])

    return _frames_response(request, frames(), release)


def _frames_response(
    request: Request, frames: AsyncIterator[bytes], release: Callable[[], None]
) -> EventStreamResponse:
    return EventStreamResponse(frames, keepalive=request.app.state.sse_keepalive, on_close=release)


# Events sent once per token: framed from a template per output item (see `DeltaFrames`).
DELTA_EVENTS = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.function_call_arguments.delta",
    }
)


class EventFrames:
    """SSE frames of one response's live events: per-token deltas from a template of their
    item's first delta, everything else dumped whole from its SDK object."""

    def __init__(self) -> None:
        self._templates: dict[tuple[str, str, int], DeltaFrames] = {}

    def frame(self, event: ResponseStreamEvent) -> bytes:
        delta = getattr(event, "delta", None)
        plain = isinstance(delta, str) and not getattr(event, "logprobs", None)
        if plain and event.type in DELTA_EVENTS:
            key = (event.type, getattr(event, "item_id", ""), getattr(event, "output_index", 0))
            template = self._templates.get(key)
            if template is None:
                sample = wire(event)
                sample.update(delta=DeltaFrames.TEXT, sequence_number=DeltaFrames.NUMBER)
                template = self._templates[key] = DeltaFrames(sample, event.type)
            return template.frame(str(delta), event.sequence_number)
        data = wire(event)
        return sse_frame(data, data["type"])


async def _drain(events: AsyncGenerator[Any, None]) -> None:
    async with aclosing(events):
        async for _ in events:
            pass


async def _collect(service: ResponsesService, prepared: PreparedResponse) -> ResponseEventMachine:
    machine = prepared.machine()
    await _drain(service.respond(prepared, machine))
    return machine


@router.post("/v1/responses")
@router.post("/responses", include_in_schema=False)
async def create_response(request: Request) -> Response:
    service = _service(request)
    body = await parse_body(request, CreateResponseRequest)
    if body.stream:
        with stream_slot(request) as release:
            return await _create_stream(request, service, body, release)
    if compaction_turn(body.input):
        run = await Compactor(service).start(body, owner_of(request))
        await until_disconnect(request, _drain(run.events))
        return JSONResponse(wire(run.machine.snapshot()))
    prepared = await service.prepare(body, owner_of(request))
    if body.background:
        job = await _jobs(request).start(prepared)
        return JSONResponse(wire(job.machine.snapshot()))
    machine = await until_disconnect(request, _collect(service, prepared))
    if machine.error_status is not None and machine.error is not None:
        # An upstream's refusal or failure keeps its status (the response is stored failed).
        raise UpstreamFailed(machine.error["message"], machine.error_status)
    return JSONResponse(wire(machine.snapshot()))


async def _create_stream(
    request: Request,
    service: ResponsesService,
    body: CreateResponseRequest,
    release: Callable[[], None],
) -> EventStreamResponse:
    stream: AsyncGenerator[ResponseStreamEvent, None]
    if compaction_turn(body.input):
        stream = (await Compactor(service).start(body, owner_of(request))).events
    else:
        prepared = await service.prepare(body, owner_of(request))
        if body.background:
            job = await _jobs(request).start(prepared)
            # A background stream outlives its client: disconnecting stops only the follow.
            return _sse(request, job.follow(after=-1), release)
        stream = service.respond(prepared)  # admission errors (503) surface before any SSE

    async def frames() -> AsyncIterator[bytes]:
        encoder = EventFrames()
        async with aclosing(stream):
            async for event in stream:
                yield encoder.frame(event)

    return _frames_response(request, frames(), release)


@router.post("/v1/responses/compact")
@router.post("/responses/compact", include_in_schema=False)
async def compact_response(request: Request) -> dict[str, Any]:
    body = await parse_body(request, CompactRequest)
    return await Compactor(_service(request)).compact(body, owner_of(request))


@router.post("/v1/responses/input_tokens")
@router.post("/responses/input_tokens", include_in_schema=False)
async def count_input_tokens(request: Request) -> dict[str, Any]:
    body = await parse_body(request, InputTokensRequest)
    count = await _service(request).count_input_tokens(body, owner_of(request))
    return {"object": "response.input_tokens", "input_tokens": count}


@router.get("/v1/responses/{response_id}")
@router.get("/responses/{response_id}", include_in_schema=False)
async def retrieve_response(
    request: Request,
    response_id: str,
    stream: bool = False,
    starting_after: int | None = Query(None, ge=-1),
) -> Response:
    include_param(request)
    owner = owner_of(request)
    if stream:
        with stream_slot(request) as release:
            events = await _stored(request).open_stream(owner, response_id, starting_after)
            return _sse(request, events, release)
    return JSONResponse(await _stored(request).retrieve(owner, response_id))


@router.delete("/v1/responses/{response_id}")
@router.delete("/responses/{response_id}", include_in_schema=False)
async def delete_response(request: Request, response_id: str) -> dict[str, Any]:
    return await _stored(request).delete(owner_of(request), response_id)


@router.post("/v1/responses/{response_id}/cancel")
@router.post("/responses/{response_id}/cancel", include_in_schema=False)
async def cancel_response(request: Request, response_id: str) -> dict[str, Any]:
    return await _stored(request).cancel(owner_of(request), response_id)


@router.get("/v1/responses/{response_id}/input_items")
@router.get("/responses/{response_id}/input_items", include_in_schema=False)
async def list_input_items(
    request: Request,
    response_id: str,
    after: str | None = None,
    limit: int | None = None,
    order: str = "desc",
) -> dict[str, Any]:
    include_param(request)
    return await _stored(request).input_items(
        owner_of(request), response_id, after=after, limit=limit, order=order
    )
