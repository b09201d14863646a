"""The vector store statements both SQL stores run, written once with `?` (restyled for
psycopg by `Statements.in_style`), and the mapping between records and rows. Chunk search
differs per database (FTS5 and `tsvector`) and stays in each mixin."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from respd.store.sql import Row, dumps, restyle
from respd.store.vectors.records import (
    FileBatchRecord,
    VectorFileRecord,
    VectorStoreRecord,
    file_counts,
)

VS_COLUMNS = "id, owner, created_at, name, metadata, expires_after, last_active_at, expires_at"
VF_COLUMNS = (
    "vector_store_id, file_id, owner, created_at, filename, status, attributes, chunking, "
    "last_error, usage_bytes, batch_id"
)
BATCH_COLUMNS = "id, vector_store_id, owner, created_at, cancelled"


@dataclass(frozen=True)
class VectorStatements:
    # A modification never moves a store to another owner.
    upsert_store: str = (
        f"INSERT INTO vector_stores ({VS_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (id) DO UPDATE SET name = excluded.name, metadata = excluded.metadata, "
        "expires_after = excluded.expires_after, last_active_at = excluded.last_active_at, "
        "expires_at = excluded.expires_at WHERE vector_stores.owner = excluded.owner"
    )
    get_store: str = f"SELECT {VS_COLUMNS} FROM vector_stores WHERE id = ? AND owner = ?"
    # Each store adds its own insertion-order tiebreak.
    list_stores: str = (
        f"SELECT {VS_COLUMNS} FROM vector_stores WHERE owner = ? ORDER BY created_at, "
    )
    counts: str = (
        "SELECT vector_store_id, status, COUNT(*) AS n, COALESCE(SUM(usage_bytes), 0) AS b "
        "FROM vector_store_files WHERE owner = ? GROUP BY vector_store_id, status"
    )
    store_counts: str = (
        "SELECT vector_store_id, status, COUNT(*) AS n, COALESCE(SUM(usage_bytes), 0) AS b "
        "FROM vector_store_files WHERE owner = ? AND vector_store_id = ? "
        "GROUP BY vector_store_id, status"
    )
    delete_store: str = "DELETE FROM vector_stores WHERE id = ? AND owner = ?"
    # Attaching a file again starts it over: its chunks are dropped by the caller first.
    upsert_file: str = (
        f"INSERT INTO vector_store_files ({VF_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (vector_store_id, file_id) DO UPDATE SET created_at = excluded.created_at, "
        "filename = excluded.filename, status = excluded.status, "
        "attributes = excluded.attributes, chunking = excluded.chunking, "
        "last_error = excluded.last_error, usage_bytes = excluded.usage_bytes, "
        "batch_id = excluded.batch_id"
    )
    list_files: str = (
        f"SELECT {VF_COLUMNS} FROM vector_store_files WHERE vector_store_id = ? AND owner = ? "
        "ORDER BY created_at, seq"
    )
    update_file: str = (
        "UPDATE vector_store_files SET attributes = ? "
        f"WHERE vector_store_id = ? AND file_id = ? AND owner = ? RETURNING {VF_COLUMNS}"
    )
    delete_file: str = (
        "DELETE FROM vector_store_files WHERE vector_store_id = ? AND file_id = ? AND owner = ?"
    )
    # Only a file still being ingested is finished: a cancelled, deleted or re-attached
    # file's late result is dropped.
    finish_file: str = (
        "UPDATE vector_store_files SET status = ?, last_error = ?, usage_bytes = ? "
        "WHERE vector_store_id = ? AND file_id = ? AND status = 'in_progress' "
        "AND created_at = ?"
    )
    file_chunks: str = (
        "SELECT c.text FROM vector_chunks c JOIN vector_store_files f "
        "ON f.vector_store_id = c.vector_store_id AND f.file_id = c.file_id "
        "WHERE f.owner = ? AND c.vector_store_id = ? AND c.file_id = ? ORDER BY c.pos"
    )
    pending_files: str = (
        f"SELECT {VF_COLUMNS} FROM vector_store_files WHERE status = 'in_progress' "
        "ORDER BY created_at, seq"
    )
    insert_batch: str = f"INSERT INTO vector_file_batches ({BATCH_COLUMNS}) VALUES (?, ?, ?, ?, ?)"
    get_batch: str = (
        f"SELECT {BATCH_COLUMNS} FROM vector_file_batches "
        "WHERE id = ? AND vector_store_id = ? AND owner = ?"
    )
    cancel_batch: str = (
        "UPDATE vector_file_batches SET cancelled = TRUE "
        "WHERE id = ? AND vector_store_id = ? AND owner = ?"
    )
    cancel_batch_files: str = (
        "UPDATE vector_store_files SET status = 'cancelled' "
        "WHERE vector_store_id = ? AND batch_id = ? AND status = 'in_progress'"
    )
    insert_chunk: str = (
        "INSERT INTO vector_chunks (vector_store_id, file_id, pos, text, embedding) "
        "VALUES (?, ?, ?, ?, ?)"
    )
    expired_stores: str = (
        "SELECT id FROM vector_stores WHERE expires_at IS NOT NULL AND expires_at <= ? LIMIT ?"
    )

    def in_style(self, placeholder: str) -> VectorStatements:
        return VectorStatements(
            **{f.name: restyle(getattr(self, f.name), placeholder) for f in fields(self)}
        )


VQMARK = VectorStatements()
VPYFORMAT = VQMARK.in_style("%s")


def store_row(record: VectorStoreRecord) -> tuple[Any, ...]:
    return (
        record.id,
        record.owner,
        record.created_at,
        record.name,
        dumps(record.metadata),
        dumps(record.expires_after) if record.expires_after is not None else None,
        record.last_active_at,
        record.expires_at,
    )


def store_record(row: Row, counts: dict[str, dict[str, tuple[int, int]]]) -> VectorStoreRecord:
    """A store's row with its files' counts (`counts[store][status] = (files, bytes)`)."""
    mine = counts.get(row["id"], {})
    statuses = [status for status, (n, _) in mine.items() for _ in range(n)]
    expires_after = row["expires_after"]
    return VectorStoreRecord(
        id=row["id"],
        owner=row["owner"],
        created_at=row["created_at"],
        name=row["name"],
        metadata=json.loads(row["metadata"]),
        expires_after=json.loads(expires_after) if expires_after else None,
        last_active_at=row["last_active_at"],
        expires_at=row["expires_at"],
        file_counts=file_counts(statuses),
        usage_bytes=sum(b for _, b in mine.values()),
    )


def count_rows(rows: Sequence[Row]) -> dict[str, dict[str, tuple[int, int]]]:
    counts: dict[str, dict[str, tuple[int, int]]] = {}
    for row in rows:
        counts.setdefault(row["vector_store_id"], {})[row["status"]] = (
            int(row["n"]),
            int(row["b"]),
        )
    return counts


def file_row(record: VectorFileRecord) -> tuple[Any, ...]:
    return (
        record.vector_store_id,
        record.file_id,
        record.owner,
        record.created_at,
        record.filename,
        record.status,
        dumps(record.attributes),
        dumps(record.chunking),
        dumps(record.last_error) if record.last_error is not None else None,
        record.usage_bytes,
        record.batch_id,
    )


def file_record(row: Row) -> VectorFileRecord:
    last_error = row["last_error"]
    return VectorFileRecord(
        vector_store_id=row["vector_store_id"],
        file_id=row["file_id"],
        owner=row["owner"],
        created_at=row["created_at"],
        filename=row["filename"],
        status=row["status"],
        attributes=json.loads(row["attributes"]),
        chunking=json.loads(row["chunking"]),
        last_error=json.loads(last_error) if last_error else None,
        usage_bytes=row["usage_bytes"],
        batch_id=row["batch_id"],
    )


def batch_row(record: FileBatchRecord) -> tuple[Any, ...]:
    return (
        record.id,
        record.vector_store_id,
        record.owner,
        record.created_at,
        record.cancelled,
    )


def batch_record(row: Row) -> FileBatchRecord:
    return FileBatchRecord(
        id=row["id"],
        vector_store_id=row["vector_store_id"],
        owner=row["owner"],
        created_at=row["created_at"],
        cancelled=bool(row["cancelled"]),
    )
