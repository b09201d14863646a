"""The wire objects of the Vector Stores API, from store records, and their cursor pages."""

from __future__ import annotations

from typing import Any

from respd.protocol.errors import InvalidRequest
from respd.service.pages import check_page_params
from respd.store.vectors.records import (
    CANCELLED,
    FAILED,
    IN_PROGRESS,
    JSON,
    FileBatchRecord,
    VectorFileRecord,
    VectorStoreRecord,
    file_counts,
)

DAY_SECS = 86400


def store_status(record: VectorStoreRecord, now: float) -> str:
    if record.expires_at is not None and record.expires_at <= now:
        return "expired"
    return IN_PROGRESS if record.file_counts.get(IN_PROGRESS) else "completed"


def store_object(record: VectorStoreRecord, now: float) -> JSON:
    """OpenAI's `VectorStore`."""
    return {
        "id": record.id,
        "object": "vector_store",
        "created_at": record.created_at,
        "name": record.name,
        "usage_bytes": record.usage_bytes,
        "file_counts": record.file_counts or file_counts([]),
        "status": store_status(record, now),
        "expires_after": record.expires_after,
        "expires_at": record.expires_at,
        "last_active_at": record.last_active_at,
        "metadata": dict(record.metadata),
    }


def file_object(record: VectorFileRecord) -> JSON:
    """OpenAI's `VectorStoreFile`."""
    return {
        "id": record.file_id,
        "object": "vector_store.file",
        "usage_bytes": record.usage_bytes,
        "created_at": record.created_at,
        "vector_store_id": record.vector_store_id,
        "status": record.status,
        "last_error": record.last_error,
        "chunking_strategy": record.chunking,
        "attributes": dict(record.attributes),
    }


def batch_status(batch: FileBatchRecord, files: list[VectorFileRecord]) -> str:
    if batch.cancelled:
        return CANCELLED
    if any(f.status == IN_PROGRESS for f in files):
        return IN_PROGRESS
    if files and all(f.status == FAILED for f in files):
        return FAILED
    return "completed"


def batch_object(batch: FileBatchRecord, files: list[VectorFileRecord]) -> JSON:
    """OpenAI's `VectorStoreFileBatch`, over the batch's files."""
    return {
        "id": batch.id,
        "object": "vector_store.files_batch",
        "created_at": batch.created_at,
        "vector_store_id": batch.vector_store_id,
        "status": batch_status(batch, files),
        "file_counts": file_counts([f.status for f in files]),
    }


def _cut(ordered: list[JSON], cursor: str, param: str) -> int:
    ids = [item["id"] for item in ordered]
    if cursor not in ids:
        raise InvalidRequest(
            f"Invalid '{param}': no item with id '{cursor}' in this list.",
            param=param,
            code="invalid_value",
        )
    return ids.index(cursor)


def cursor_page(
    items: list[JSON],
    *,
    limit: int | None,
    order: str | None,
    after: str | None,
    before: str | None,
) -> JSON:
    """An OpenAI cursor page over `items` (oldest first): `after` starts past an id, `before`
    ends ahead of one (then the page is the `limit` items just before it)."""
    limit, order = check_page_params(limit, order)
    ordered = list(reversed(items)) if order == "desc" else list(items)
    if after is not None:
        ordered = ordered[_cut(ordered, after, "after") + 1 :]
    if before is not None:
        ordered = ordered[: _cut(ordered, before, "before")]
        more = len(ordered) > limit
        data = ordered[-limit:]
    else:
        more = len(ordered) > limit
        data = ordered[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


def expiry(expires_after: JSON | None, last_active_at: int) -> int | None:
    if expires_after is None:
        return None
    return last_active_at + int(expires_after["days"]) * DAY_SECS


def search_page(query: Any, hits: list[JSON]) -> JSON:
    """OpenAI's search results page."""
    return {
        "object": "vector_store.search_results.page",
        "search_query": query if isinstance(query, str) else list(query),
        "data": hits,
        "has_more": False,
        "next_page": None,
    }
