"""The Conversations API: a conversation is a durable list of items that responses extend."""

from __future__ import annotations

import time
from typing import Any

from respd.protocol.errors import InvalidRequest, MissingParameter, NotFound
from respd.service.ids import new_id
from respd.service.media.lowering import Lowering
from respd.service.metadata import check_metadata
from respd.service.pages import page
from respd.service.responses.history import conversation_not_found
from respd.service.responses.items import normalize_items
from respd.service.responses.translate import check_item_shapes, input_to_messages
from respd.service.shared import Shared
from respd.store.base import JSON, ConversationRecord

MAX_ITEMS_PER_CALL = 20


class ConversationsService:
    def __init__(self, shared: Shared) -> None:
        self.store = shared.store
        self.sealer = shared.sealer
        self.media = shared.media
        self.limits = shared.limits

    async def _items(self, items: Any, owner: str, *, required: bool) -> list[JSON]:
        if items is None:
            if required:
                raise MissingParameter("items")
            return []
        if not isinstance(items, list):
            raise InvalidRequest(
                "Invalid type for 'items': expected an array of items.",
                param="items",
                code="invalid_type",
            )
        self.limits.check(items, None, None, items_param="items")
        check_item_shapes(items, "items")
        if len(items) > MAX_ITEMS_PER_CALL:
            raise InvalidRequest(
                f"Invalid 'items': array too long. Expected at most {MAX_ITEMS_PER_CALL} "
                f"items, but got {len(items)}.",
                param="items",
                code="array_above_max_length",
            )
        # Validate each item, media included (decoded and checked, whatever the model: a
        # conversation is not tied to one; a text-only model refuses its images when used).
        media = await self.media.resolve_items(items, owner, prefix="items")
        input_to_messages(
            items,
            lowering=Lowering("conversation", True, media=media),
            prefix="items",
            sealer=self.sealer,
        )
        return normalize_items(items)

    async def _get(self, owner: str, conversation_id: str) -> ConversationRecord:
        record = await self.store.get_conversation(owner, conversation_id)
        if record is None:
            raise conversation_not_found(conversation_id, param="conversation_id")
        return record

    async def create(self, owner: str, items: Any, metadata: dict[str, str] | None) -> JSON:
        check_metadata(metadata)
        stored = await self._items(items, owner, required=False)
        record = ConversationRecord(new_id("conv"), owner, int(time.time()), metadata or {})
        await self.store.create_conversation(record, stored)
        return record.as_object()

    async def retrieve(self, owner: str, conversation_id: str) -> JSON:
        return (await self._get(owner, conversation_id)).as_object()

    async def update(
        self, owner: str, conversation_id: str, metadata: dict[str, str] | None
    ) -> JSON:
        check_metadata(metadata)
        record = await self.store.update_conversation(owner, conversation_id, metadata or {})
        if record is None:
            raise conversation_not_found(conversation_id, param="conversation_id")
        return record.as_object()

    async def delete(self, owner: str, conversation_id: str) -> JSON:
        if not await self.store.delete_conversation(owner, conversation_id):
            raise conversation_not_found(conversation_id, param="conversation_id")
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    async def add_items(self, owner: str, conversation_id: str, items: Any) -> JSON:
        stored = await self._items(items, owner, required=True)
        if not await self.store.add_conversation_items(owner, conversation_id, stored):
            raise conversation_not_found(conversation_id, param="conversation_id")
        return {
            "object": "list",
            "data": stored,
            "first_id": stored[0]["id"] if stored else None,
            "last_id": stored[-1]["id"] if stored else None,
            "has_more": False,
        }

    async def _all_items(self, owner: str, conversation_id: str) -> list[JSON]:
        items = await self.store.conversation_items(owner, conversation_id)
        if items is None:
            raise conversation_not_found(conversation_id, param="conversation_id")
        return items

    async def list_items(
        self, owner: str, conversation_id: str, *, after: str | None, limit: int | None, order: str
    ) -> JSON:
        items = await self._all_items(owner, conversation_id)
        return page(items, after=after, limit=limit, order=order)

    async def get_item(self, owner: str, conversation_id: str, item_id: str) -> JSON:
        for item in await self._all_items(owner, conversation_id):
            if item.get("id") == item_id:
                return item
        raise _item_not_found(item_id)

    async def delete_item(self, owner: str, conversation_id: str, item_id: str) -> JSON:
        record = await self._get(owner, conversation_id)
        if not await self.store.delete_conversation_item(owner, conversation_id, item_id):
            raise _item_not_found(item_id)
        return record.as_object()


def _item_not_found(item_id: str) -> NotFound:
    return NotFound(f"Item with id '{item_id}' not found.", param="item_id")
