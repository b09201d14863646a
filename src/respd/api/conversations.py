"""`/v1/conversations` routes (the Conversations API)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from respd.api.body import parse_body
from respd.api.identity import owner_of
from respd.api.query import include_param
from respd.protocol.conversations import (
    AddItemsRequest,
    CreateConversationRequest,
    UpdateConversationRequest,
)
from respd.service.conversations import ConversationsService

router = APIRouter()


def _service(request: Request) -> ConversationsService:
    return request.app.state.conversations


@router.post("/v1/conversations")
@router.post("/conversations", include_in_schema=False)
async def create_conversation(request: Request) -> dict[str, Any]:
    body = await parse_body(request, CreateConversationRequest)
    return await _service(request).create(owner_of(request), body.items, body.metadata)


@router.get("/v1/conversations/{conversation_id}")
@router.get("/conversations/{conversation_id}", include_in_schema=False)
async def retrieve_conversation(request: Request, conversation_id: str) -> dict[str, Any]:
    return await _service(request).retrieve(owner_of(request), conversation_id)


@router.post("/v1/conversations/{conversation_id}")
@router.post("/conversations/{conversation_id}", include_in_schema=False)
async def update_conversation(request: Request, conversation_id: str) -> dict[str, Any]:
    body = await parse_body(request, UpdateConversationRequest)
    return await _service(request).update(owner_of(request), conversation_id, body.metadata)


@router.delete("/v1/conversations/{conversation_id}")
@router.delete("/conversations/{conversation_id}", include_in_schema=False)
async def delete_conversation(request: Request, conversation_id: str) -> dict[str, Any]:
    return await _service(request).delete(owner_of(request), conversation_id)


@router.post("/v1/conversations/{conversation_id}/items")
@router.post("/conversations/{conversation_id}/items", include_in_schema=False)
async def add_items(request: Request, conversation_id: str) -> dict[str, Any]:
    include_param(request)
    body = await parse_body(request, AddItemsRequest)
    return await _service(request).add_items(owner_of(request), conversation_id, body.items)


@router.get("/v1/conversations/{conversation_id}/items")
@router.get("/conversations/{conversation_id}/items", include_in_schema=False)
async def list_items(
    request: Request,
    conversation_id: str,
    after: str | None = None,
    limit: int | None = None,
    order: str = "desc",
) -> dict[str, Any]:
    include_param(request)
    return await _service(request).list_items(
        owner_of(request), conversation_id, after=after, limit=limit, order=order
    )


@router.get("/v1/conversations/{conversation_id}/items/{item_id}")
@router.get("/conversations/{conversation_id}/items/{item_id}", include_in_schema=False)
async def retrieve_item(request: Request, conversation_id: str, item_id: str) -> dict[str, Any]:
    include_param(request)
    return await _service(request).get_item(owner_of(request), conversation_id, item_id)


@router.delete("/v1/conversations/{conversation_id}/items/{item_id}")
@router.delete("/conversations/{conversation_id}/items/{item_id}", include_in_schema=False)
async def delete_item(request: Request, conversation_id: str, item_id: str) -> dict[str, Any]:
    return await _service(request).delete_item(owner_of(request), conversation_id, item_id)
