"""Request bodies of the Vector Stores API. Chunking strategies, attributes, filters and
ranking options stay loose here: the service checks them and names the exact field."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class CreateVectorStoreRequest(_Lenient):
    name: str | None = None
    file_ids: list[str] | None = None
    chunking_strategy: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    expires_after: dict[str, Any] | None = None
    description: str | None = None


class UpdateVectorStoreRequest(_Lenient):
    """Only the fields a body names change; `expires_after: null` removes the expiry."""

    name: str | None = None
    metadata: dict[str, str] | None = None
    expires_after: dict[str, Any] | None = None


class CreateVectorStoreFileRequest(_Lenient):
    file_id: str
    attributes: dict[str, Any] | None = None
    chunking_strategy: dict[str, Any] | None = None


class UpdateVectorStoreFileRequest(_Lenient):
    attributes: dict[str, Any] | None


class CreateFileBatchRequest(_Lenient):
    file_ids: list[str] | None = None
    files: list[dict[str, Any]] | None = None
    attributes: dict[str, Any] | None = None
    chunking_strategy: dict[str, Any] | None = None


class SearchVectorStoreRequest(_Lenient):
    query: str | list[str]
    filters: dict[str, Any] | None = None
    max_num_results: int = 10
    ranking_options: dict[str, Any] | None = None
    rewrite_query: bool = False  # accepted; queries are searched as written
