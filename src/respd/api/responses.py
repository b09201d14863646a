"""`/v1/responses` routes: create, retrieve (or replay a background stream), delete, cancel,
input items and input token counts."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from openai.types.responses import ResponseStreamEvent

from respd.api.body import load_json, parse_body, validate_object
from respd.api.identity import owner_of
from respd.api.providers import provider_headers
from respd.api.query import include_param
from respd.api.quotas import stream_slot
from respd.api.streaming import (
    DeltaFrames,
    EventStreamResponse,
    after_wait,
    sse_frame,
    until_disconnect,
)
from respd.protocol.errors import APIError
from respd.protocol.input_tokens import InputTokensRequest
from respd.protocol.responses import CreateResponseRequest
from respd.protocol.wire import wire
from respd.service.responses.compaction import CompactRequest
from respd.service.responses.http_steering import SteerableStreams
from respd.service.responses.service import Answer, EventStream, ResponsesService
from respd.service.responses.stored import StoredResponses
from respd.store.base import JSON

router = APIRouter()
log = logging.getLogger(__name__)

# The `error` event that ends a stream whose events broke (OpenAI's stream error shape).
BROKEN_STREAM = {
    "type": "error",
    "code": "server_error",
    "message": "The server had an error while processing your request.",
    "param": None,
}


def _service(request: Request) -> ResponsesService:
    service: ResponsesService = request.app.state.responses
    return service


def _stored(request: Request) -> StoredResponses:
    stored: StoredResponses = request.app.state.stored
    return stored


# Events sent once per token: framed from a template per output item (see `DeltaFrames`).
DELTA_EVENTS = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.function_call_arguments.delta",
    }
)


class EventFrames:
    """SSE frames of one response's events: per-token deltas from a template of their
    item's first delta, everything else dumped whole from its SDK object (or as the JSON a
    background job's log holds)."""

    def __init__(self) -> None:
        self._templates: dict[tuple[str, str, int], DeltaFrames] = {}

    def frame(self, event: ResponseStreamEvent | JSON) -> bytes:
        if isinstance(event, dict):
            return sse_frame(event, event["type"])
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


def _sse(
    request: Request,
    events: AsyncGenerator[ResponseStreamEvent | JSON, None],
    release: Callable[[], None] | None = None,
) -> EventStreamResponse:
    """SSE frames of `events`; closing the response closes `events` at once and gives back
    the stream slot (`release`) taken before any work started."""

    async def frames() -> AsyncIterator[bytes]:
        encoder = EventFrames()
        async with aclosing(events):
            try:
                async for event in events:
                    yield encoder.frame(event)
            except Exception:  # the service ends its own failures; this is the last word
                log.exception("a response stream broke")
                yield sse_frame(BROKEN_STREAM, "error")

    return EventStreamResponse(
        frames(), keepalive=request.app.state.sse_keepalive, on_close=release
    )


def _error_event(exc: APIError) -> bytes:
    """A refusal once the stream has begun: Responses' `error` event."""
    body = exc.body()["error"]
    return sse_frame({**body, "type": "error", "sequence_number": 0}, "error")


def _framed(
    request: Request, created: Answer | EventStream, release: Callable[[], None] | None = None
) -> Response:
    if isinstance(created, Answer):
        return JSONResponse(created.response, headers=provider_headers(created.response))
    return _sse(request, created.events, release)


@router.post("/v1/responses")
@router.post("/responses", include_in_schema=False)
async def create_response(request: Request) -> Response:
    service = _service(request)
    owner = owner_of(request)
    raw = await request.body()
    data = load_json(raw) if raw else None
    if isinstance(data, dict):  # steering input that waited for this continuation goes first
        data = _steerable(request).unpark(owner, data)
    body = validate_object(data, CreateResponseRequest, request.url.path)
    if body.stream:  # the service holds the caller's stream slot until the events close

        async def start() -> Response:
            created = await service.create(body, owner)
            if isinstance(created, EventStream) and not body.background:
                assert isinstance(data, dict)
                created.events = _steerable(request).events(owner, data, body, created, _validate)
            return _framed(request, created, getattr(created, "release", None))

        models = request.app.state.models
        if models.needs_load(body.model):  # the stream starts, and keeps alive, meanwhile
            return after_wait(request, lambda: models.ready(body.model), start, _error_event)
        return await start()
    created = await service.create(body, owner, until=lambda work: until_disconnect(request, work))
    return _framed(request, created)


@router.post("/v1/responses/{response_id}/steer")
@router.post("/responses/{response_id}/steer", include_in_schema=False)
async def steer_response(request: Request, response_id: str) -> dict[str, Any]:
    raw = await request.body()
    body = load_json(raw) if raw else None
    return _steerable(request).steer(owner_of(request), response_id, body)


def _steerable(request: Request) -> SteerableStreams:
    steerable: SteerableStreams = request.app.state.steerable
    return steerable


def _validate(data: JSON) -> CreateResponseRequest:
    return validate_object(data, CreateResponseRequest, "/v1/responses")


@router.post("/v1/responses/compact")
@router.post("/responses/compact", include_in_schema=False)
async def compact_response(request: Request) -> dict[str, Any]:
    body = await parse_body(request, CompactRequest)
    return await _service(request).compact(body, owner_of(request))


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
