"""Request bodies of the Conversations API. Items stay dicts: `translate.py` validates them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class CreateConversationRequest(_Lenient):
    items: list[dict[str, Any]] | None = None
    metadata: dict[str, str] | None = None


class UpdateConversationRequest(_Lenient):
    metadata: dict[str, str] | None


class AddItemsRequest(_Lenient):
    items: list[dict[str, Any]]
