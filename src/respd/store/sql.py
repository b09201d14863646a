"""What the SQL stores (`sqlite.py`, `postgres.py`) share: the statements both run and the
mapping between records and rows.

Both schemas (`migrations.py`) have the same tables and columns, so most statements are the
same text; only the placeholder differs (sqlite3's `?`, psycopg's `%s`). They are written
once here with `?` and restyled per driver (`Statements.in_style`). What differs in meaning
(leases and claims, cascades, upserts of events, batched purges) stays in each store.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, Protocol

from respd.store.base import JSON, ConversationRecord, FileRecord, ResponseRecord

RESPONSE_COLUMNS = (
    "id, owner, created_at, status, background, previous_response_id, conversation_id, "
    "response, input_items"
)
UNFINISHED = "status IN ('queued', 'in_progress')"
# Visibility under retention: the last write within the TTL (the parameter is the cut-off).
FRESH = "updated_at >= ?"
FILE_COLUMNS = "id, owner, created_at, filename, purpose, bytes, mime_type, expires_at"
# A file is visible until its `expires_at` (NULL: until deleted).
UNEXPIRED = "(expires_at IS NULL OR expires_at > ?)"
PURGE_BATCH = 500  # rows per purge transaction, so no lock is held for long


def restyle(sql: str, placeholder: str) -> str:
    """`sql` with each `?` placeholder written as `placeholder`; the statements hold no
    other `?`, and no `%` a pyformat driver would read as one of its own."""
    if "%" in sql:
        raise ValueError(f"a literal % in a shared statement: {sql!r}")
    return sql.replace("?", placeholder)


@dataclass(frozen=True)
class Statements:
    """The statements both SQL stores run, in one placeholder style."""

    # Only the holder may write a running job, and only while it is visible.
    update_held_response: str = (
        "UPDATE responses SET status = ?, response = ?, input_items = ?, "
        "conversation_id = ?, updated_at = ? WHERE id = ? AND worker = ? "
        f"AND {UNFINISHED} AND {FRESH}"
    )
    # A finished record is never overwritten by an unfinished one, whatever order two
    # racing writes (a job's progress and its cancellation) arrive in.
    upsert_response: str = (
        f"INSERT INTO responses ({RESPONSE_COLUMNS}, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (id) DO UPDATE SET status = excluded.status, "
        "response = excluded.response, input_items = excluded.input_items, "
        "conversation_id = excluded.conversation_id, "
        "updated_at = excluded.updated_at "
        f"WHERE responses.{UNFINISHED} "
        "OR excluded.status NOT IN ('queued', 'in_progress')"
    )
    get_response: str = (
        f"SELECT {RESPONSE_COLUMNS} FROM responses WHERE id = ? AND owner = ? AND {FRESH}"
    )
    delete_response: str = f"DELETE FROM responses WHERE id = ? AND owner = ? AND {FRESH}"
    read_events: str = (
        "SELECT e.event FROM response_events e JOIN responses r ON r.id = e.response_id "
        "WHERE e.response_id = ? AND r.owner = ? AND r.updated_at >= ? AND e.seq > ? "
        "ORDER BY e.seq"
    )
    start_job: str = (
        f"INSERT INTO responses ({RESPONSE_COLUMNS}, updated_at, worker, lease_until) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    cancel_requests: str = (
        f"SELECT id FROM responses WHERE worker = ? AND cancel_requested AND {UNFINISHED}"
    )
    owns_conversation: str = f"SELECT 1 FROM conversations WHERE id = ? AND owner = ? AND {FRESH}"
    create_conversation: str = (
        "INSERT INTO conversations (id, owner, created_at, metadata, updated_at) "
        "VALUES (?, ?, ?, ?, ?)"
    )
    get_conversation: str = f"SELECT * FROM conversations WHERE id = ? AND owner = ? AND {FRESH}"
    update_conversation: str = (
        "UPDATE conversations SET metadata = ?, updated_at = ? "
        f"WHERE id = ? AND owner = ? AND {FRESH} RETURNING *"
    )
    delete_conversation: str = f"DELETE FROM conversations WHERE id = ? AND owner = ? AND {FRESH}"
    insert_items: str = (
        "INSERT INTO conversation_items (conversation_id, item_id, item) VALUES (?, ?, ?)"
    )
    conversation_items: str = (
        "SELECT item FROM conversation_items WHERE conversation_id = ? ORDER BY pos"
    )
    delete_item: str = "DELETE FROM conversation_items WHERE conversation_id = ? AND item_id = ?"
    insert_file: str = (
        f"INSERT INTO files ({FILE_COLUMNS}, content) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    # Expired files go with the next upload too, not only with the periodic purge: file
    # bytes are the bulk of a store, and the index makes this cheap.
    drop_expired_files: str = "DELETE FROM files WHERE expires_at IS NOT NULL AND expires_at <= ?"
    get_file: str = f"SELECT {FILE_COLUMNS} FROM files WHERE id = ? AND owner = ? AND {UNEXPIRED}"
    file_content: str = f"SELECT content FROM files WHERE id = ? AND owner = ? AND {UNEXPIRED}"
    # Metadata only, the bytes stay on disk; each store adds its own insertion-order tiebreak.
    list_files: str = (
        f"SELECT {FILE_COLUMNS} FROM files WHERE owner = ? AND {UNEXPIRED} ORDER BY created_at, "
    )
    delete_file: str = f"DELETE FROM files WHERE id = ? AND owner = ? AND {UNEXPIRED}"
    # What one owner keeps: file contents, stored responses (their JSON) and vector
    # stores' chunks.
    owner_bytes: str = (
        "SELECT (SELECT COALESCE(SUM(bytes), 0) FROM files WHERE owner = ?) + "
        "(SELECT COALESCE(SUM(LENGTH(response) + LENGTH(input_items)), 0) FROM responses "
        "WHERE owner = ?) + "
        "(SELECT COALESCE(SUM(usage_bytes), 0) FROM vector_store_files WHERE owner = ?) AS n"
    )
    stats: str = (
        "SELECT (SELECT COUNT(*) FROM responses) AS a, "
        "(SELECT COUNT(*) FROM conversations) AS b, "
        "(SELECT COUNT(*) FROM conversation_items) AS c, "
        "(SELECT COUNT(*) FROM files) AS d, "
        "(SELECT COALESCE(SUM(bytes), 0) FROM files) AS e, "
        "(SELECT COUNT(*) FROM response_events) AS f"
    )

    def in_style(self, placeholder: str) -> Statements:
        """These statements with `placeholder` for each parameter."""
        return Statements(
            **{f.name: restyle(getattr(self, f.name), placeholder) for f in fields(self)}
        )


QMARK = Statements()  # sqlite3
PYFORMAT = QMARK.in_style("%s")  # psycopg


class Row(Protocol):
    """A row by column name: a `sqlite3.Row` or a psycopg `dict_row`."""

    def __getitem__(self, key: str, /) -> Any: ...


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def response_record(row: Row) -> ResponseRecord:
    return ResponseRecord(
        id=row["id"],
        owner=row["owner"],
        created_at=row["created_at"],
        status=row["status"],
        background=bool(row["background"]),
        previous_response_id=row["previous_response_id"],
        conversation_id=row["conversation_id"],
        response=json.loads(row["response"]),
        input_items=json.loads(row["input_items"]),
    )


def response_row(record: ResponseRecord) -> tuple[Any, ...]:
    """The values of `RESPONSE_COLUMNS`, in order."""
    return (
        record.id,
        record.owner,
        record.created_at,
        record.status,
        record.background,
        record.previous_response_id,
        record.conversation_id,
        dumps(record.response),
        dumps(record.input_items),
    )


def held_response_params(record: ResponseRecord, now: float, worker: str) -> tuple[Any, ...]:
    """The parameters of `update_held_response` but its last, the retention cut-off."""
    return (
        record.status,
        dumps(record.response),
        dumps(record.input_items),
        record.conversation_id,
        now,
        record.id,
        worker,
    )


def conversation_record(row: Row) -> ConversationRecord:
    return ConversationRecord(
        id=row["id"],
        owner=row["owner"],
        created_at=row["created_at"],
        metadata=json.loads(row["metadata"]),
    )


def conversation_row(record: ConversationRecord, now: float) -> tuple[Any, ...]:
    """The parameters of `create_conversation`."""
    return (record.id, record.owner, record.created_at, dumps(record.metadata), now)


def item_rows(conversation_id: str, items: list[JSON]) -> list[tuple[str, str, str]]:
    """The parameters of `insert_items`, one tuple an item."""
    return [(conversation_id, str(i.get("id", "")), dumps(i)) for i in items]


def event_rows(response_id: str, events: list[JSON]) -> list[tuple[str, int, str]]:
    """(response_id, seq, event) for each event, keyed by its sequence number."""
    return [(response_id, int(e["sequence_number"]), dumps(e)) for e in events]


def file_record(row: Row) -> FileRecord:
    return FileRecord(
        id=row["id"],
        owner=row["owner"],
        created_at=row["created_at"],
        filename=row["filename"],
        purpose=row["purpose"],
        bytes=row["bytes"],
        mime_type=row["mime_type"],
        expires_at=row["expires_at"],
    )


def file_row(record: FileRecord) -> tuple[Any, ...]:
    """The values of `FILE_COLUMNS`, in order (the content follows them)."""
    return (
        record.id,
        record.owner,
        record.created_at,
        record.filename,
        record.purpose,
        record.bytes,
        record.mime_type,
        record.expires_at,
    )
