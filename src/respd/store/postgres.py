"""PostgreSQL store: several respd processes share one database (`--store postgresql://…`).

psycopg 3 with a psycopg_pool `AsyncConnectionPool`: the driver is async end to end, so the
event loop never waits on a socket, and each store call borrows one pooled connection for
one transaction (committed when the call returns, rolled back if it raises). The schema is
a versioned, append-only list (`POSTGRES_MIGRATIONS`) applied under an advisory lock, so
replicas that start together migrate once.

Times are seconds since the epoch from the injected clock, as in the other stores; replicas
sharing a database are expected to keep their clocks in step (NTP), which a lease of tens
of seconds tolerates easily.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from respd.store.base import (
    JSON,
    STAT_KEYS,
    ConversationRecord,
    FileRecord,
    ResponseRecord,
)
from respd.store.migrations import POSTGRES_MIGRATIONS, newer_than_known, statements
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
    restyle,
)
from respd.store.sql import PYFORMAT as Q
from respd.store.vectors.postgres import PostgresVectors

Conn = AsyncConnection[DictRow]

# A job is stale when its lease ran out: its holder stopped renewing it (it died).
_STALE = f"{UNFINISHED} AND (lease_until IS NULL OR lease_until < ?)"
MIGRATION_LOCK = 0x72657370_64  # pg_advisory_xact_lock key: "respd"


def _pg(sql: str) -> str:
    """A statement of this store's own, written with `?` like the shared ones."""
    return restyle(sql, "%s")


_RENEW_LEASES = _pg(
    "UPDATE responses SET lease_until = ? WHERE id = ANY(?) AND worker = ? "
    f"AND {UNFINISHED} AND {FRESH} RETURNING id"
)
# Under READ COMMITTED a second UPDATE of the same row waits for the first and re-checks
# the lease, which the first has renewed: exactly one caller wins.
_CLAIM_JOB = _pg(
    "UPDATE responses SET worker = ?, lease_until = ?, cancel_requested = FALSE "
    f"WHERE id = ? AND {_STALE} RETURNING {RESPONSE_COLUMNS}"
)
# SKIP LOCKED: replicas sweeping at the same moment split the stale jobs between them
# instead of queueing on the same rows.
_CLAIM_STALE_JOBS = _pg(
    "UPDATE responses SET worker = ?, lease_until = ?, cancel_requested = FALSE "
    "WHERE id IN (SELECT id FROM responses "
    f"WHERE {_STALE} ORDER BY created_at, id LIMIT 100 FOR UPDATE SKIP LOCKED) "
    f"RETURNING {RESPONSE_COLUMNS}"
)
_REQUEST_CANCEL = _pg(
    "UPDATE responses SET cancel_requested = TRUE "
    f"WHERE id = ? AND owner = ? AND {UNFINISHED} AND {FRESH}"
)
_TOUCH_CONVERSATION = _pg(
    f"UPDATE conversations SET updated_at = ? WHERE id = ? AND owner = ? AND {FRESH}"
)
_INSERT_EVENTS = _pg(
    "INSERT INTO response_events (response_id, seq, event) VALUES (?, ?, ?) "
    "ON CONFLICT (response_id, seq) DO UPDATE SET event = excluded.event"
)
# Expired rows, a batch at a time (children cascade).
_PURGES = tuple(
    _pg(sql)
    for sql in (
        "DELETE FROM responses WHERE id IN (SELECT id FROM responses "
        "WHERE updated_at < ? LIMIT ? FOR UPDATE SKIP LOCKED)",
        "DELETE FROM conversations WHERE id IN (SELECT id FROM conversations "
        "WHERE updated_at < ? LIMIT ? FOR UPDATE SKIP LOCKED)",
        "DELETE FROM files WHERE id IN (SELECT id FROM files WHERE expires_at IS NOT "
        "NULL AND expires_at <= ? LIMIT ? FOR UPDATE SKIP LOCKED)",
    )
)


class PostgresStore(PostgresVectors):
    def __init__(
        self,
        dsn: str,
        *,
        responses_ttl_secs: float = 0,
        conversations_ttl_secs: float = 0,
        clock: Callable[[], float] = time.time,
        max_connections: int = 10,
    ) -> None:
        """Nothing connects until `open()`, which must run inside the event loop."""
        self.dsn = dsn
        self.responses_ttl = responses_ttl_secs
        self.conversations_ttl = conversations_ttl_secs
        self.clock = clock
        self.max_connections = max_connections
        self._pool: AsyncConnectionPool[Conn] | None = None

    async def open(self) -> None:
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            self.dsn,
            min_size=1,
            max_size=self.max_connections,
            kwargs={"row_factory": dict_row},
            open=False,
            name="respd",
        )
        await pool.open(wait=True, timeout=30)
        self._pool = pool
        try:
            await self._migrate()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    def _connection(self) -> AbstractAsyncContextManager[Conn]:
        """One pooled connection, one transaction (`async with`)."""
        if self._pool is None:
            raise RuntimeError("PostgresStore.open() was not called")
        return self._pool.connection()

    async def _migrate(self) -> None:
        async with self._connection() as conn:
            # Transactional DDL under a lock: replicas starting together migrate once.
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"
            )
            row = await (await conn.execute("SELECT version FROM schema_version")).fetchone()
            if row is None:
                await conn.execute("INSERT INTO schema_version (version) VALUES (0)")
            version = row["version"] if row else 0
            if version > len(POSTGRES_MIGRATIONS):
                raise newer_than_known(version, len(POSTGRES_MIGRATIONS))
            for number, script in enumerate(POSTGRES_MIGRATIONS[version:], start=version + 1):
                for statement in statements(script):
                    await conn.execute(statement)
                await conn.execute("UPDATE schema_version SET version = %s", (number,))

    def _cutoff(self, ttl: float) -> float:
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
        async with self._connection() as conn:
            if worker is not None:
                # The holder's write takes the row lock first, so a concurrent delete or
                # takeover either happened before (nothing is written) or waits for it.
                cur = await conn.execute(
                    Q.update_held_response,
                    (
                        *held_response_params(record, now, worker),
                        self._cutoff(self.responses_ttl),
                    ),
                )
                if not cur.rowcount:
                    return False
            else:
                await conn.execute(Q.upsert_response, (*response_row(record), now))
            if conversation is not None:
                conv_id, items = conversation
                if await self._touch_conversation(conn, record.owner, conv_id):
                    await _insert_items(conn, conv_id, items)
            await _insert_events(conn, record.id, events or [])
        return True

    async def get_response(self, owner: str, response_id: str) -> ResponseRecord | None:
        async with self._connection() as conn:
            cur = await conn.execute(
                Q.get_response, (response_id, owner, self._cutoff(self.responses_ttl))
            )
            row = await cur.fetchone()
        return response_record(row) if row else None

    async def delete_response(self, owner: str, response_id: str) -> bool:
        async with self._connection() as conn:  # its events go by ON DELETE CASCADE
            cur = await conn.execute(
                Q.delete_response, (response_id, owner, self._cutoff(self.responses_ttl))
            )
            return cur.rowcount > 0

    async def read_events(self, owner: str, response_id: str, after: int) -> list[JSON]:
        async with self._connection() as conn:
            cur = await conn.execute(
                Q.read_events, (response_id, owner, self._cutoff(self.responses_ttl), after)
            )
            rows = await cur.fetchall()
        return [json.loads(r["event"]) for r in rows]

    # -- background jobs --------------------------------------------------------------------

    async def start_job(self, record: ResponseRecord, worker: str, lease_secs: float) -> None:
        now = self.clock()
        async with self._connection() as conn:
            await conn.execute(Q.start_job, (*response_row(record), now, worker, now + lease_secs))

    async def renew_leases(
        self, worker: str, response_ids: list[str], lease_secs: float
    ) -> list[str]:
        if not response_ids:
            return []
        async with self._connection() as conn:
            cur = await conn.execute(
                _RENEW_LEASES,
                (
                    self.clock() + lease_secs,
                    response_ids,
                    worker,
                    self._cutoff(self.responses_ttl),
                ),
            )
            held = {r["id"] for r in await cur.fetchall()}
        return [rid for rid in response_ids if rid not in held]

    async def claim_job(
        self, response_id: str, worker: str, lease_secs: float
    ) -> ResponseRecord | None:
        now = self.clock()
        async with self._connection() as conn:
            cur = await conn.execute(_CLAIM_JOB, (worker, now + lease_secs, response_id, now))
            row = await cur.fetchone()
        return response_record(row) if row else None

    async def claim_stale_jobs(self, worker: str, lease_secs: float) -> list[ResponseRecord]:
        now = self.clock()
        async with self._connection() as conn:
            cur = await conn.execute(_CLAIM_STALE_JOBS, (worker, now + lease_secs, now))
            rows = await cur.fetchall()
        return sorted((response_record(r) for r in rows), key=lambda r: (r.created_at, r.id))

    async def request_cancel(self, owner: str, response_id: str) -> bool:
        async with self._connection() as conn:
            cur = await conn.execute(
                _REQUEST_CANCEL, (response_id, owner, self._cutoff(self.responses_ttl))
            )
            return cur.rowcount > 0

    async def cancel_requests(self, worker: str) -> list[str]:
        async with self._connection() as conn:
            cur = await conn.execute(Q.cancel_requests, (worker,))
            return [r["id"] for r in await cur.fetchall()]

    # -- conversations --------------------------------------------------------------------

    async def _touch_conversation(self, conn: Conn, owner: str, conversation_id: str) -> bool:
        """Mark a write to a visible conversation of `owner` (locking its row for the rest
        of the transaction); False when there is none."""
        cur = await conn.execute(
            _TOUCH_CONVERSATION,
            (self.clock(), conversation_id, owner, self._cutoff(self.conversations_ttl)),
        )
        return cur.rowcount > 0

    async def _owns_conversation(self, conn: Conn, owner: str, conversation_id: str) -> bool:
        cur = await conn.execute(
            Q.owns_conversation,
            (conversation_id, owner, self._cutoff(self.conversations_ttl)),
        )
        return await cur.fetchone() is not None

    async def create_conversation(self, record: ConversationRecord, items: list[JSON]) -> None:
        async with self._connection() as conn:
            await conn.execute(Q.create_conversation, conversation_row(record, self.clock()))
            await _insert_items(conn, record.id, items)

    async def get_conversation(self, owner: str, conversation_id: str) -> ConversationRecord | None:
        async with self._connection() as conn:
            cur = await conn.execute(
                Q.get_conversation,
                (conversation_id, owner, self._cutoff(self.conversations_ttl)),
            )
            row = await cur.fetchone()
        return conversation_record(row) if row else None

    async def update_conversation(
        self, owner: str, conversation_id: str, metadata: dict[str, str]
    ) -> ConversationRecord | None:
        async with self._connection() as conn:
            cur = await conn.execute(
                Q.update_conversation,
                (
                    dumps(metadata),
                    self.clock(),
                    conversation_id,
                    owner,
                    self._cutoff(self.conversations_ttl),
                ),
            )
            row = await cur.fetchone()
        return conversation_record(row) if row else None

    async def delete_conversation(self, owner: str, conversation_id: str) -> bool:
        async with self._connection() as conn:  # its items go by ON DELETE CASCADE
            cur = await conn.execute(
                Q.delete_conversation,
                (conversation_id, owner, self._cutoff(self.conversations_ttl)),
            )
            return cur.rowcount > 0

    async def add_conversation_items(
        self, owner: str, conversation_id: str, items: list[JSON]
    ) -> bool:
        async with self._connection() as conn:
            if not await self._touch_conversation(conn, owner, conversation_id):
                return False
            await _insert_items(conn, conversation_id, items)
            return True

    async def conversation_items(self, owner: str, conversation_id: str) -> list[JSON] | None:
        async with self._connection() as conn:
            if not await self._owns_conversation(conn, owner, conversation_id):
                return None
            cur = await conn.execute(Q.conversation_items, (conversation_id,))
            rows = await cur.fetchall()
        return [json.loads(r["item"]) for r in rows]

    async def delete_conversation_item(
        self, owner: str, conversation_id: str, item_id: str
    ) -> bool:
        async with self._connection() as conn:
            if not await self._touch_conversation(conn, owner, conversation_id):
                return False
            cur = await conn.execute(Q.delete_item, (conversation_id, item_id))
            if not cur.rowcount:
                await conn.rollback()  # nothing deleted: not a write
                return False
            return True

    # -- files ----------------------------------------------------------------------------

    async def save_file(self, record: FileRecord, content: bytes) -> None:
        async with self._connection() as conn:
            await conn.execute(Q.insert_file, (*file_row(record), content))
            await conn.execute(Q.drop_expired_files, (int(self.clock()),))

    async def get_file(self, owner: str, file_id: str) -> FileRecord | None:
        async with self._connection() as conn:
            cur = await conn.execute(Q.get_file, (file_id, owner, int(self.clock())))
            row = await cur.fetchone()
        return file_record(row) if row else None

    async def file_content(self, owner: str, file_id: str) -> bytes | None:
        async with self._connection() as conn:
            cur = await conn.execute(Q.file_content, (file_id, owner, int(self.clock())))
            row = await cur.fetchone()
        return bytes(row["content"]) if row else None

    async def list_files(self, owner: str) -> list[FileRecord]:
        async with self._connection() as conn:
            cur = await conn.execute(Q.list_files + "seq", (owner, int(self.clock())))
            rows = await cur.fetchall()
        return [file_record(r) for r in rows]

    async def delete_file(self, owner: str, file_id: str) -> bool:
        async with self._connection() as conn:
            cur = await conn.execute(Q.delete_file, (file_id, owner, int(self.clock())))
            return cur.rowcount > 0

    # -- housekeeping -----------------------------------------------------------------------

    async def purge_expired(self) -> int:
        """Delete expired rows in batches, one short transaction each (children cascade)."""
        cutoffs: tuple[Callable[[], float], ...] = (
            lambda: self._cutoff(self.responses_ttl),
            lambda: self._cutoff(self.conversations_ttl),
            lambda: int(self.clock()),
        )
        total = 0
        for query, cutoff in zip(_PURGES, cutoffs, strict=True):
            while True:
                async with self._connection() as conn:
                    removed = (await conn.execute(query, (cutoff(), PURGE_BATCH))).rowcount
                total += removed
                if removed < PURGE_BATCH:
                    break
        return total + await self._purge_vector_stores()

    async def owner_bytes(self, owner: str) -> int:
        async with self._connection() as conn:
            row = await (await conn.execute(Q.owner_bytes, (owner, owner, owner))).fetchone()
        return int(row["n"]) if row is not None else 0

    async def stats(self) -> dict[str, int]:
        async with self._connection() as conn:
            cur = await conn.execute(Q.stats)
            row = await cur.fetchone()
        assert row is not None
        return dict(zip(STAT_KEYS, (int(v) for v in row.values()), strict=True))


async def _insert_items(conn: Conn, conversation_id: str, items: list[JSON]) -> None:
    if items:
        async with conn.cursor() as cur:
            await cur.executemany(Q.insert_items, item_rows(conversation_id, items))


async def _insert_events(conn: Conn, response_id: str, events: list[JSON]) -> None:
    if events:
        async with conn.cursor() as cur:
            await cur.executemany(_INSERT_EVENTS, event_rows(response_id, events))
