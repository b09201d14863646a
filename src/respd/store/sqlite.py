"""SQLite store: the default, one file under the data dir, so state survives a restart.

WAL mode with one transaction per write: a crash (even SIGKILL) mid-write leaves the last
committed state. The stdlib `sqlite3` runs in worker threads behind one lock, which keeps
the event loop free without another dependency. The file (and its -wal/-shm companions,
which SQLite creates with the main file's mode) is private to its user: 0600, in a 0700
directory when respd creates it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from respd.store.base import JSON, STAT_KEYS, ConversationRecord, FileRecord, ResponseRecord
from respd.store.migrations import migrate
from respd.store.sql import (
    FRESH,
    PURGE_BATCH,
    RESPONSE_COLUMNS,
    UNFINISHED,
    conversation_record,
    conversation_row,
    dumps,
    event_rows,
    file_record,
    file_row,
    held_response_params,
    item_rows,
    response_record,
    response_row,
)
from respd.store.sql import QMARK as Q
from respd.store.vectors.sqlite import SqliteVectors

T = TypeVar("T")


def create_private(path: Path) -> None:
    """Create the database file 0600 (and its directory 0700) if they do not exist yet;
    an existing file or directory keeps the mode its owner gave it."""
    directory = path.parent
    if not directory.exists():
        directory.parent.mkdir(parents=True, exist_ok=True)
        directory.mkdir(mode=0o700, exist_ok=True)
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))


class SqliteStore(SqliteVectors):
    def __init__(
        self,
        path: Path,
        *,
        responses_ttl_secs: float = 0,
        conversations_ttl_secs: float = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """TTLs of 0 keep records until deleted; `clock` is the wall clock (seconds)."""
        create_private(path)
        self.path = path
        self.responses_ttl = responses_ttl_secs
        self.conversations_ttl = conversations_ttl_secs
        self.clock = clock
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level="DEFERRED")
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA busy_timeout=5000")
        migrate(self._conn)

    async def open(self) -> None:
        return None  # connected and migrated in __init__, so a bad file fails at start-up

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def locked() -> T:
            with self._lock, self._conn:  # commit on success, roll back on error
                return fn(self._conn)

        return await asyncio.to_thread(locked)

    def _cutoff(self, ttl: float) -> float:
        """Records last written before this are expired (-inf: no TTL)."""
        return self.clock() - ttl if ttl > 0 else float("-inf")

    # -- responses ------------------------------------------------------------------------

    async def save_response(
        self,
        record: ResponseRecord,
        *,
        conversation: tuple[str, list[JSON]] | None = None,
        events: list[JSON] | None = None,
        worker: str | None = None,
    ) -> bool:
        now = self.clock()
        # Serialized here, on the event loop, not in the worker thread.
        params = (
            held_response_params(record, now, worker)
            if worker is not None
            else (*response_row(record), now)
        )

        def write(conn: sqlite3.Connection) -> bool:
            if worker is not None:
                held = (*params, self._cutoff(self.responses_ttl))
                if not conn.execute(Q.update_held_response, held).rowcount:
                    return False
            else:
                conn.execute(Q.upsert_response, params)
            if conversation is not None:
                conv_id, items = conversation
                if self._owns_conversation(conn, record.owner, conv_id):
                    _insert_items(conn, conv_id, items)
                    self._touch_conversation(conn, conv_id)
            _insert_events(conn, record.id, events or [])
            return True

        return await self._run(write)

    async def get_response(self, owner: str, response_id: str) -> ResponseRecord | None:
        def read(conn: sqlite3.Connection) -> ResponseRecord | None:
            row = conn.execute(
                Q.get_response, (response_id, owner, self._cutoff(self.responses_ttl))
            ).fetchone()
            return response_record(row) if row else None

        return await self._run(read)

    async def delete_response(self, owner: str, response_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                Q.delete_response, (response_id, owner, self._cutoff(self.responses_ttl))
            )
            if cur.rowcount:
                conn.execute("DELETE FROM response_events WHERE response_id = ?", (response_id,))
            return cur.rowcount > 0

        return await self._run(delete)

    async def read_events(self, owner: str, response_id: str, after: int) -> list[JSON]:
        def read(conn: sqlite3.Connection) -> list[JSON]:
            rows = conn.execute(
                Q.read_events, (response_id, owner, self._cutoff(self.responses_ttl), after)
            ).fetchall()
            return [json.loads(r[0]) for r in rows]

        return await self._run(read)

    # -- background jobs --------------------------------------------------------------------

    async def start_job(self, record: ResponseRecord, worker: str, lease_secs: float) -> None:
        now = self.clock()

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(Q.start_job, (*response_row(record), now, worker, now + lease_secs))

        await self._run(write)

    async def renew_leases(
        self, worker: str, response_ids: list[str], lease_secs: float
    ) -> list[str]:
        until = self.clock() + lease_secs

        def write(conn: sqlite3.Connection) -> list[str]:
            lost = []
            for rid in response_ids:
                cur = conn.execute(
                    "UPDATE responses SET lease_until = ? WHERE id = ? AND worker = ? "
                    f"AND {UNFINISHED} AND {FRESH}",
                    (until, rid, worker, self._cutoff(self.responses_ttl)),
                )
                if not cur.rowcount:
                    lost.append(rid)
            return lost

        return await self._run(write)

    # One process owns the file, so a job held by another worker id is a dead process's.
    _STALE = f"{UNFINISHED} AND (worker IS NULL OR worker != ? OR lease_until < ?)"

    async def claim_job(
        self, response_id: str, worker: str, lease_secs: float
    ) -> ResponseRecord | None:
        now = self.clock()

        def write(conn: sqlite3.Connection) -> ResponseRecord | None:
            row = conn.execute(
                "UPDATE responses SET worker = ?, lease_until = ?, cancel_requested = 0 "
                f"WHERE id = ? AND {self._STALE} RETURNING {RESPONSE_COLUMNS}",
                (worker, now + lease_secs, response_id, worker, now),
            ).fetchone()
            return response_record(row) if row else None

        return await self._run(write)

    async def claim_stale_jobs(self, worker: str, lease_secs: float) -> list[ResponseRecord]:
        now = self.clock()

        def write(conn: sqlite3.Connection) -> list[ResponseRecord]:
            rows = conn.execute(
                "UPDATE responses SET worker = ?, lease_until = ?, cancel_requested = 0 "
                f"WHERE {self._STALE} RETURNING {RESPONSE_COLUMNS}",
                (worker, now + lease_secs, worker, now),
            ).fetchall()
            return sorted((response_record(r) for r in rows), key=lambda r: (r.created_at, r.id))

        return await self._run(write)

    async def request_cancel(self, owner: str, response_id: str) -> bool:
        def write(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE responses SET cancel_requested = 1 "
                f"WHERE id = ? AND owner = ? AND {UNFINISHED} AND {FRESH}",
                (response_id, owner, self._cutoff(self.responses_ttl)),
            )
            return cur.rowcount > 0

        return await self._run(write)

    async def cancel_requests(self, worker: str) -> list[str]:
        def read(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(Q.cancel_requests, (worker,)).fetchall()
            return [r[0] for r in rows]

        return await self._run(read)

    # -- conversations --------------------------------------------------------------------

    def _owns_conversation(
        self, conn: sqlite3.Connection, owner: str, conversation_id: str
    ) -> bool:
        row = conn.execute(
            Q.owns_conversation,
            (conversation_id, owner, self._cutoff(self.conversations_ttl)),
        ).fetchone()
        return row is not None

    def _touch_conversation(self, conn: sqlite3.Connection, conversation_id: str) -> None:
        conn.execute(
            "UPDATE conversations SET updated_at = ? WHERE id = ?", (self.clock(), conversation_id)
        )

    async def create_conversation(self, record: ConversationRecord, items: list[JSON]) -> None:
        def write(conn: sqlite3.Connection) -> None:
            conn.execute(Q.create_conversation, conversation_row(record, self.clock()))
            _insert_items(conn, record.id, items)

        await self._run(write)

    async def get_conversation(self, owner: str, conversation_id: str) -> ConversationRecord | None:
        def read(conn: sqlite3.Connection) -> ConversationRecord | None:
            row = conn.execute(
                Q.get_conversation,
                (conversation_id, owner, self._cutoff(self.conversations_ttl)),
            ).fetchone()
            return conversation_record(row) if row else None

        return await self._run(read)

    async def update_conversation(
        self, owner: str, conversation_id: str, metadata: dict[str, str]
    ) -> ConversationRecord | None:
        def write(conn: sqlite3.Connection) -> ConversationRecord | None:
            row = conn.execute(
                Q.update_conversation,
                (
                    dumps(metadata),
                    self.clock(),
                    conversation_id,
                    owner,
                    self._cutoff(self.conversations_ttl),
                ),
            ).fetchone()
            return conversation_record(row) if row else None

        return await self._run(write)

    async def delete_conversation(self, owner: str, conversation_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                Q.delete_conversation,
                (conversation_id, owner, self._cutoff(self.conversations_ttl)),
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
            if not self._owns_conversation(conn, owner, conversation_id):
                return False
            _insert_items(conn, conversation_id, items)
            self._touch_conversation(conn, conversation_id)
            return True

        return await self._run(write)

    async def conversation_items(self, owner: str, conversation_id: str) -> list[JSON] | None:
        def read(conn: sqlite3.Connection) -> list[JSON] | None:
            if not self._owns_conversation(conn, owner, conversation_id):
                return None
            rows = conn.execute(Q.conversation_items, (conversation_id,)).fetchall()
            return [json.loads(r[0]) for r in rows]

        return await self._run(read)

    async def delete_conversation_item(
        self, owner: str, conversation_id: str, item_id: str
    ) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            if not self._owns_conversation(conn, owner, conversation_id):
                return False
            cur = conn.execute(Q.delete_item, (conversation_id, item_id))
            if cur.rowcount:
                self._touch_conversation(conn, conversation_id)
            return cur.rowcount > 0

        return await self._run(delete)

    # -- files ----------------------------------------------------------------------------

    async def save_file(self, record: FileRecord, content: bytes) -> None:
        row = (*file_row(record), sqlite3.Binary(content))

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(Q.insert_file, row)
            conn.execute(Q.drop_expired_files, (int(self.clock()),))

        await self._run(write)

    async def get_file(self, owner: str, file_id: str) -> FileRecord | None:
        def read(conn: sqlite3.Connection) -> FileRecord | None:
            row = conn.execute(Q.get_file, (file_id, owner, int(self.clock()))).fetchone()
            return file_record(row) if row else None

        return await self._run(read)

    async def file_content(self, owner: str, file_id: str) -> bytes | None:
        def read(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute(Q.file_content, (file_id, owner, int(self.clock()))).fetchone()
            return bytes(row[0]) if row else None

        return await self._run(read)

    async def list_files(self, owner: str) -> list[FileRecord]:
        def read(conn: sqlite3.Connection) -> list[FileRecord]:
            rows = conn.execute(Q.list_files + "rowid", (owner, int(self.clock()))).fetchall()
            return [file_record(r) for r in rows]

        return await self._run(read)

    async def delete_file(self, owner: str, file_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(Q.delete_file, (file_id, owner, int(self.clock())))
            return cur.rowcount > 0

        return await self._run(delete)

    # -- housekeeping -----------------------------------------------------------------------

    async def purge_expired(self) -> int:
        """Delete expired rows in small transactions, each in a worker thread."""
        total = 0
        steps = (
            self._purge_responses,
            self._purge_conversations,
            self._purge_files,
            self._purge_vector_stores,
        )
        for step in steps:
            while removed := await self._run(step):
                total += removed
        return total

    def _purge_responses(self, conn: sqlite3.Connection) -> int:
        ids = _ids(
            conn.execute(
                "SELECT id FROM responses WHERE updated_at < ? LIMIT ?",
                (self._cutoff(self.responses_ttl), PURGE_BATCH),
            )
        )
        conn.executemany("DELETE FROM response_events WHERE response_id = ?", ids)
        conn.executemany("DELETE FROM responses WHERE id = ?", ids)
        return len(ids)

    def _purge_conversations(self, conn: sqlite3.Connection) -> int:
        ids = _ids(
            conn.execute(
                "SELECT id FROM conversations WHERE updated_at < ? LIMIT ?",
                (self._cutoff(self.conversations_ttl), PURGE_BATCH),
            )
        )
        conn.executemany("DELETE FROM conversation_items WHERE conversation_id = ?", ids)
        conn.executemany("DELETE FROM conversations WHERE id = ?", ids)
        return len(ids)

    def _purge_files(self, conn: sqlite3.Connection) -> int:
        ids = _ids(
            conn.execute(
                "SELECT id FROM files WHERE expires_at IS NOT NULL AND expires_at <= ? LIMIT ?",
                (int(self.clock()), PURGE_BATCH),
            )
        )
        conn.executemany("DELETE FROM files WHERE id = ?", ids)
        return len(ids)

    async def owner_bytes(self, owner: str) -> int:
        def read(conn: sqlite3.Connection) -> int:
            return int(conn.execute(Q.owner_bytes, (owner, owner, owner)).fetchone()[0])

        return await self._run(read)

    async def stats(self) -> dict[str, int]:
        def read(conn: sqlite3.Connection) -> dict[str, int]:
            row = conn.execute(Q.stats).fetchone()
            return dict(zip(STAT_KEYS, (int(v) for v in row), strict=True))

        return await self._run(read)

    async def close(self) -> None:
        def close() -> None:
            with self._lock:
                self._close_vectors()
                self._conn.close()

        await asyncio.to_thread(close)


def _ids(cursor: sqlite3.Cursor) -> list[tuple[str]]:
    return [(row[0],) for row in cursor.fetchall()]


def _insert_items(conn: sqlite3.Connection, conversation_id: str, items: list[JSON]) -> None:
    conn.executemany(Q.insert_items, item_rows(conversation_id, items))


def _insert_events(conn: sqlite3.Connection, response_id: str, events: list[JSON]) -> None:
    conn.executemany(
        "INSERT OR REPLACE INTO response_events (response_id, seq, event) VALUES (?, ?, ?)",
        event_rows(response_id, events),
    )
