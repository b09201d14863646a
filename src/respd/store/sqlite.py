"""SQLite store: the default, one file under the data dir, so state survives a restart.

WAL mode with one transaction per write: a crash (even SIGKILL) mid-write leaves the last
committed state. The stdlib `sqlite3` runs in worker threads behind one lock, which keeps
the event loop free without another dependency.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from respd.store.base import JSON, ConversationRecord, FileRecord, ResponseRecord
from respd.store.migrations import migrate

T = TypeVar("T")

_RESPONSE_COLUMNS = (
    "id, owner, created_at, status, background, previous_response_id, conversation_id, "
    "response, input_items"
)


_FILE_COLUMNS = "id, owner, created_at, filename, purpose, bytes, mime_type, expires_at"
# A file is visible until its `expires_at` (NULL: until deleted).
_UNEXPIRED = "(expires_at IS NULL OR expires_at > ?)"


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _response(row: sqlite3.Row) -> ResponseRecord:
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


def _conversation(row: sqlite3.Row) -> ConversationRecord:
    return ConversationRecord(
        id=row["id"],
        owner=row["owner"],
        created_at=row["created_at"],
        metadata=json.loads(row["metadata"]),
    )


def _file(row: sqlite3.Row) -> FileRecord:
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


class SqliteStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level="DEFERRED")
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA busy_timeout=5000")
        migrate(self._conn)

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def locked() -> T:
            with self._lock, self._conn:  # commit on success, roll back on error
                return fn(self._conn)

        return await asyncio.to_thread(locked)

    # -- responses ------------------------------------------------------------------------

    async def save_response(
        self,
        record: ResponseRecord,
        *,
        conversation: tuple[str, list[JSON]] | None = None,
        events: list[JSON] | None = None,
    ) -> None:
        row = (
            record.id,
            record.owner,
            record.created_at,
            record.status,
            int(record.background),
            record.previous_response_id,
            record.conversation_id,
            _dumps(record.response),
            _dumps(record.input_items),
        )

        def write(conn: sqlite3.Connection) -> None:
            # A finished record is never overwritten by an unfinished one, whatever order
            # two racing writes (a job's progress and its cancellation) reach the file in.
            conn.execute(
                f"INSERT INTO responses ({_RESPONSE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET status = excluded.status, "
                "response = excluded.response, input_items = excluded.input_items, "
                "conversation_id = excluded.conversation_id "
                "WHERE responses.status IN ('queued', 'in_progress') "
                "OR excluded.status NOT IN ('queued', 'in_progress')",
                row,
            )
            if conversation is not None:
                conv_id, items = conversation
                exists = conn.execute(
                    "SELECT 1 FROM conversations WHERE id = ? AND owner = ?",
                    (conv_id, record.owner),
                ).fetchone()
                if exists:
                    _insert_items(conn, conv_id, items)
            _insert_events(conn, record.id, events or [])

        await self._run(write)

    async def append_events(self, response_id: str, events: list[JSON]) -> None:
        await self._run(lambda conn: _insert_events(conn, response_id, events))

    async def get_response(self, owner: str, response_id: str) -> ResponseRecord | None:
        def read(conn: sqlite3.Connection) -> ResponseRecord | None:
            row = conn.execute(
                f"SELECT {_RESPONSE_COLUMNS} FROM responses WHERE id = ? AND owner = ?",
                (response_id, owner),
            ).fetchone()
            return _response(row) if row else None

        return await self._run(read)

    async def delete_response(self, owner: str, response_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "DELETE FROM responses WHERE id = ? AND owner = ?", (response_id, owner)
            )
            if cur.rowcount:
                conn.execute("DELETE FROM response_events WHERE response_id = ?", (response_id,))
            return cur.rowcount > 0

        return await self._run(delete)

    async def read_events(self, owner: str, response_id: str, after: int) -> list[JSON]:
        def read(conn: sqlite3.Connection) -> list[JSON]:
            rows = conn.execute(
                "SELECT e.event FROM response_events e JOIN responses r ON r.id = e.response_id "
                "WHERE e.response_id = ? AND r.owner = ? AND e.seq > ? ORDER BY e.seq",
                (response_id, owner, after),
            ).fetchall()
            return [json.loads(r[0]) for r in rows]

        return await self._run(read)

    async def unfinished_responses(self) -> list[ResponseRecord]:
        def read(conn: sqlite3.Connection) -> list[ResponseRecord]:
            rows = conn.execute(
                f"SELECT {_RESPONSE_COLUMNS} FROM responses "
                "WHERE status IN ('queued', 'in_progress')"
            ).fetchall()
            return [_response(r) for r in rows]

        return await self._run(read)

    # -- conversations --------------------------------------------------------------------

    async def create_conversation(self, record: ConversationRecord, items: list[JSON]) -> None:
        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO conversations (id, owner, created_at, metadata) VALUES (?, ?, ?, ?)",
                (record.id, record.owner, record.created_at, _dumps(record.metadata)),
            )
            _insert_items(conn, record.id, items)

        await self._run(write)

    async def get_conversation(self, owner: str, conversation_id: str) -> ConversationRecord | None:
        def read(conn: sqlite3.Connection) -> ConversationRecord | None:
            row = conn.execute(
                "SELECT * FROM conversations WHERE id = ? AND owner = ?", (conversation_id, owner)
            ).fetchone()
            return _conversation(row) if row else None

        return await self._run(read)

    async def update_conversation(
        self, owner: str, conversation_id: str, metadata: dict[str, str]
    ) -> ConversationRecord | None:
        def write(conn: sqlite3.Connection) -> ConversationRecord | None:
            conn.execute(
                "UPDATE conversations SET metadata = ? WHERE id = ? AND owner = ?",
                (_dumps(metadata), conversation_id, owner),
            )
            row = conn.execute(
                "SELECT * FROM conversations WHERE id = ? AND owner = ?", (conversation_id, owner)
            ).fetchone()
            return _conversation(row) if row else None

        return await self._run(write)

    async def delete_conversation(self, owner: str, conversation_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "DELETE FROM conversations WHERE id = ? AND owner = ?", (conversation_id, owner)
            )
            if cur.rowcount:
                conn.execute(
                    "DELETE FROM conversation_items WHERE conversation_id = ?", (conversation_id,)
                )
            return cur.rowcount > 0

        return await self._run(delete)

    async def add_conversation_items(
        self, owner: str, conversation_id: str, items: list[JSON]
    ) -> bool:
        def write(conn: sqlite3.Connection) -> bool:
            if not _owns_conversation(conn, owner, conversation_id):
                return False
            _insert_items(conn, conversation_id, items)
            return True

        return await self._run(write)

    async def conversation_items(self, owner: str, conversation_id: str) -> list[JSON] | None:
        def read(conn: sqlite3.Connection) -> list[JSON] | None:
            if not _owns_conversation(conn, owner, conversation_id):
                return None
            rows = conn.execute(
                "SELECT item FROM conversation_items WHERE conversation_id = ? ORDER BY pos",
                (conversation_id,),
            ).fetchall()
            return [json.loads(r[0]) for r in rows]

        return await self._run(read)

    async def delete_conversation_item(
        self, owner: str, conversation_id: str, item_id: str
    ) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            if not _owns_conversation(conn, owner, conversation_id):
                return False
            cur = conn.execute(
                "DELETE FROM conversation_items WHERE conversation_id = ? AND item_id = ?",
                (conversation_id, item_id),
            )
            return cur.rowcount > 0

        return await self._run(delete)

    # -- files ----------------------------------------------------------------------------

    async def save_file(self, record: FileRecord, content: bytes) -> None:
        row = (
            record.id,
            record.owner,
            record.created_at,
            record.filename,
            record.purpose,
            record.bytes,
            record.mime_type,
            record.expires_at,
            sqlite3.Binary(content),
        )

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                f"INSERT INTO files ({_FILE_COLUMNS}, content) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
            # Expired files are invisible to every read; their rows are purged here, lazily.
            conn.execute(
                "DELETE FROM files WHERE expires_at IS NOT NULL AND expires_at <= ?",
                (int(time.time()),),
            )

        await self._run(write)

    async def get_file(self, owner: str, file_id: str) -> FileRecord | None:
        def read(conn: sqlite3.Connection) -> FileRecord | None:
            row = conn.execute(
                f"SELECT {_FILE_COLUMNS} FROM files WHERE id = ? AND owner = ? AND {_UNEXPIRED}",
                (file_id, owner, int(time.time())),
            ).fetchone()
            return _file(row) if row else None

        return await self._run(read)

    async def file_content(self, owner: str, file_id: str) -> bytes | None:
        def read(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute(
                f"SELECT content FROM files WHERE id = ? AND owner = ? AND {_UNEXPIRED}",
                (file_id, owner, int(time.time())),
            ).fetchone()
            return bytes(row[0]) if row else None

        return await self._run(read)

    async def list_files(self, owner: str) -> list[FileRecord]:
        def read(conn: sqlite3.Connection) -> list[FileRecord]:
            rows = conn.execute(  # metadata only: the BLOBs stay on disk
                f"SELECT {_FILE_COLUMNS} FROM files WHERE owner = ? AND {_UNEXPIRED} "
                "ORDER BY created_at, rowid",
                (owner, int(time.time())),
            ).fetchall()
            return [_file(r) for r in rows]

        return await self._run(read)

    async def delete_file(self, owner: str, file_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                f"DELETE FROM files WHERE id = ? AND owner = ? AND {_UNEXPIRED}",
                (file_id, owner, int(time.time())),
            )
            return cur.rowcount > 0

        return await self._run(delete)

    async def close(self) -> None:
        def close() -> None:
            with self._lock:
                self._conn.close()

        await asyncio.to_thread(close)


def _owns_conversation(conn: sqlite3.Connection, owner: str, conversation_id: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM conversations WHERE id = ? AND owner = ?", (conversation_id, owner)
    ).fetchone()
    return row is not None


def _insert_items(conn: sqlite3.Connection, conversation_id: str, items: list[JSON]) -> None:
    conn.executemany(
        "INSERT INTO conversation_items (conversation_id, item_id, item) VALUES (?, ?, ?)",
        [(conversation_id, str(i.get("id", "")), _dumps(i)) for i in items],
    )


def _insert_events(conn: sqlite3.Connection, response_id: str, events: list[JSON]) -> None:
    conn.executemany(
        "INSERT OR REPLACE INTO response_events (response_id, seq, event) VALUES (?, ?, ?)",
        [(response_id, int(e["sequence_number"]), _dumps(e)) for e in events],
    )
