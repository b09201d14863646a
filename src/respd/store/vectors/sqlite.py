"""The vector store methods of `SqliteStore`: rows in plain tables, chunk text in an FTS5
table (porter stemming over unicode61 words) ranked by its built-in BM25, vectors as
float32 BLOBs ranked by sqlite-vec's exact cosine distance in SQL (`nearest.py`), or read
back for the service's numpy scan where sqlite-vec cannot be loaded.

sqlite-vec's own `vec0` tables scan exactly too; ranking the BLOBs where they lie keeps one
copy of each vector and spares reading every one of them into Python per search."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

from respd.store.sql import PURGE_BATCH
from respd.store.vectors.nearest import VectorReader
from respd.store.vectors.records import (
    COMPLETED,
    FAILED,
    JSON,
    Chunk,
    ChunkHit,
    FileBatchRecord,
    VectorFileRecord,
    VectorStoreRecord,
)
from respd.store.vectors.sql import (
    VQMARK as Q,
)
from respd.store.vectors.sql import (
    batch_record,
    batch_row,
    count_rows,
    file_record,
    file_row,
    store_record,
    store_row,
)

T = TypeVar("T")

# The stores first, so that the (vector_store_id, file_id) index narrows the rows.
_KEYED = (
    "c.vector_store_id IN (SELECT value FROM json_each(?)) "
    "AND (c.vector_store_id || '/' || c.file_id) IN (SELECT value FROM json_each(?))"
)
_LEXICAL = (
    "SELECT c.id, c.vector_store_id, c.file_id, c.text, -bm25(vector_chunks_fts) AS score "
    "FROM vector_chunks_fts JOIN vector_chunks c ON c.id = vector_chunks_fts.rowid "
    f"WHERE vector_chunks_fts MATCH ? AND {_KEYED} ORDER BY bm25(vector_chunks_fts) LIMIT ?"
)
_VECTORS = (
    f"SELECT c.id, c.embedding FROM vector_chunks c WHERE c.embedding IS NOT NULL AND {_KEYED}"
)
# Ranks the rows `_VECTORS` reads, of the query's width only, as the service's numpy scan
# does: best first, ties by id. sqlite-vec answers NULL for a zero vector, which the scan
# scores 0 (a distance of 1).
_NEAREST = (
    "SELECT c.id FROM vector_chunks c WHERE c.embedding IS NOT NULL "
    f"AND length(c.embedding) = ? AND {_KEYED} "
    "ORDER BY coalesce(vec_distance_cosine(c.embedding, ?), 1.0), c.id LIMIT ?"
)
_BY_ID = (
    "SELECT id, vector_store_id, file_id, text FROM vector_chunks "
    "WHERE id IN (SELECT value FROM json_each(?))"
)


def _keyed(keys: list[str]) -> tuple[str, str]:
    """The parameters of `_KEYED`: the stores of `keys`, then the keys."""
    return json.dumps(sorted({k.split("/", 1)[0] for k in keys})), json.dumps(keys)


def _drop_chunks(conn: sqlite3.Connection, where: str, params: tuple[str, ...]) -> None:
    """Delete the chunks `where` selects, with their full-text rows."""
    conn.execute(
        "DELETE FROM vector_chunks_fts WHERE rowid IN "
        f"(SELECT id FROM vector_chunks WHERE {where})",
        params,
    )
    conn.execute(f"DELETE FROM vector_chunks WHERE {where}", params)


def _drop_store(conn: sqlite3.Connection, store_id: str) -> None:
    _drop_chunks(conn, "vector_store_id = ?", (store_id,))
    conn.execute("DELETE FROM vector_store_files WHERE vector_store_id = ?", (store_id,))
    conn.execute("DELETE FROM vector_file_batches WHERE vector_store_id = ?", (store_id,))
    conn.execute("DELETE FROM vector_stores WHERE id = ?", (store_id,))


def _add_files(
    conn: sqlite3.Connection, files: list[VectorFileRecord], batch: FileBatchRecord | None
) -> None:
    if batch is not None:
        conn.execute(Q.insert_batch, batch_row(batch))
    for record in files:
        _drop_chunks(
            conn, "vector_store_id = ? AND file_id = ?", (record.vector_store_id, record.file_id)
        )
        conn.execute(Q.upsert_file, file_row(record))


class SqliteVectors:
    """Mixed into `SqliteStore`, whose `_run`, `clock`, `path` and `_lock` these use."""

    clock: Callable[[], float]
    path: Path
    _lock: threading.Lock
    # The sqlite-vec connection, opened on the first vector search; `_vectors_off` once it
    # failed to open (warned once) or the store closed.
    _vector_reader: VectorReader | None = None
    _vectors_off: bool = False

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    async def put_vector_store(
        self,
        record: VectorStoreRecord,
        files: list[VectorFileRecord] | None = None,
        batch: FileBatchRecord | None = None,
    ) -> None:
        def write(conn: sqlite3.Connection) -> None:
            conn.execute(Q.upsert_store, store_row(record))
            _add_files(conn, files or [], batch)

        await self._run(write)

    async def get_vector_store(self, owner: str, store_id: str) -> VectorStoreRecord | None:
        def read(conn: sqlite3.Connection) -> VectorStoreRecord | None:
            row = conn.execute(Q.get_store, (store_id, owner)).fetchone()
            if row is None:
                return None
            counts = count_rows(conn.execute(Q.store_counts, (owner, store_id)).fetchall())
            return store_record(row, counts)

        return await self._run(read)

    async def list_vector_stores(self, owner: str) -> list[VectorStoreRecord]:
        def read(conn: sqlite3.Connection) -> list[VectorStoreRecord]:
            counts = count_rows(conn.execute(Q.counts, (owner,)).fetchall())
            rows = conn.execute(Q.list_stores + "rowid", (owner,)).fetchall()
            return [store_record(row, counts) for row in rows]

        return await self._run(read)

    async def delete_vector_store(self, owner: str, store_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            if conn.execute(Q.get_store, (store_id, owner)).fetchone() is None:
                return False
            _drop_store(conn, store_id)
            return True

        return await self._run(delete)

    async def add_vector_files(
        self,
        owner: str,
        store_id: str,
        files: list[VectorFileRecord],
        batch: FileBatchRecord | None = None,
    ) -> bool:
        def write(conn: sqlite3.Connection) -> bool:
            if conn.execute(Q.get_store, (store_id, owner)).fetchone() is None:
                return False
            _add_files(conn, files, batch)
            return True

        return await self._run(write)

    async def list_vector_files(self, owner: str, store_id: str) -> list[VectorFileRecord]:
        def read(conn: sqlite3.Connection) -> list[VectorFileRecord]:
            return [file_record(r) for r in conn.execute(Q.list_files, (store_id, owner))]

        return await self._run(read)

    async def update_vector_file(
        self, owner: str, store_id: str, file_id: str, attributes: JSON
    ) -> VectorFileRecord | None:
        def write(conn: sqlite3.Connection) -> VectorFileRecord | None:
            params = (json.dumps(attributes), store_id, file_id, owner)
            row = conn.execute(Q.update_file, params).fetchone()
            return file_record(row) if row else None

        return await self._run(write)

    async def delete_vector_file(self, owner: str, store_id: str, file_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            if not conn.execute(Q.delete_file, (store_id, file_id, owner)).rowcount:
                return False
            _drop_chunks(conn, "vector_store_id = ? AND file_id = ?", (store_id, file_id))
            return True

        return await self._run(delete)

    async def finish_vector_file(
        self, record: VectorFileRecord, chunks: list[Chunk], error: JSON | None = None
    ) -> bool:
        size = sum(len(c.text.encode()) + len(c.embedding or b"") for c in chunks)
        status = FAILED if error is not None else COMPLETED
        last_error = json.dumps(error) if error is not None else None
        params = (status, last_error, size, record.vector_store_id, record.file_id)

        def write(conn: sqlite3.Connection) -> bool:
            if not conn.execute(Q.finish_file, (*params, record.created_at)).rowcount:
                return False
            for pos, chunk in enumerate(chunks):
                row = (record.vector_store_id, record.file_id, pos, chunk.text, chunk.embedding)
                cur = conn.execute(Q.insert_chunk, row)
                conn.execute(
                    "INSERT INTO vector_chunks_fts (rowid, text) VALUES (?, ?)",
                    (cur.lastrowid, chunk.text),
                )
            return True

        return await self._run(write)

    async def vector_file_chunks(self, owner: str, store_id: str, file_id: str) -> list[str]:
        def read(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(Q.file_chunks, (owner, store_id, file_id)).fetchall()
            return [r[0] for r in rows]

        return await self._run(read)

    async def pending_vector_files(self) -> list[VectorFileRecord]:
        def read(conn: sqlite3.Connection) -> list[VectorFileRecord]:
            return [file_record(r) for r in conn.execute(Q.pending_files)]

        return await self._run(read)

    async def get_file_batch(
        self, owner: str, store_id: str, batch_id: str
    ) -> FileBatchRecord | None:
        def read(conn: sqlite3.Connection) -> FileBatchRecord | None:
            row = conn.execute(Q.get_batch, (batch_id, store_id, owner)).fetchone()
            return batch_record(row) if row else None

        return await self._run(read)

    async def cancel_file_batch(self, owner: str, store_id: str, batch_id: str) -> bool:
        def write(conn: sqlite3.Connection) -> bool:
            if not conn.execute(Q.cancel_batch, (batch_id, store_id, owner)).rowcount:
                return False
            conn.execute(Q.cancel_batch_files, (store_id, batch_id))
            return True

        return await self._run(write)

    async def lexical_chunks(self, keys: list[str], terms: list[str], limit: int) -> list[ChunkHit]:
        if not keys or not terms:
            return []
        match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)

        def read(conn: sqlite3.Connection) -> list[ChunkHit]:
            rows = conn.execute(_LEXICAL, (match, *_keyed(keys), limit)).fetchall()
            return [ChunkHit(r[0], r[1], r[2], r[3], float(r[4])) for r in rows]

        return await self._run(read)

    async def chunk_vectors(self, keys: list[str]) -> list[tuple[int, bytes]]:
        def read(conn: sqlite3.Connection) -> list[tuple[int, bytes]]:
            return [(r[0], bytes(r[1])) for r in conn.execute(_VECTORS, _keyed(keys))]

        return await self._run(read) if keys else []

    def _reader(self) -> VectorReader | None:
        """The sqlite-vec connection, opened on first use; the caller holds `_lock`."""
        if self._vector_reader is None and not self._vectors_off:
            self._vector_reader = VectorReader.open(self.path)
            self._vectors_off = self._vector_reader is None
        return self._vector_reader

    async def nearest_chunks(
        self, keys: list[str], vector: list[float], limit: int
    ) -> list[int] | None:
        query = np.asarray(vector, dtype="<f4")
        # A zero query matches nothing, as in the numpy scan.
        empty = limit <= 0 or not keys or float(np.linalg.norm(query)) == 0
        params = (4 * query.shape[0], *_keyed(keys), query.tobytes(), limit)

        # Under the main connection's lock: the two copies of SQLite do not see each
        # other's locks (see nearest.py), so a read must never overlap a write.
        def read() -> list[int] | None:
            with self._lock:
                reader = self._reader()
                if reader is None:
                    return None
                return [] if empty else reader.ids(_NEAREST, params)

        return await asyncio.to_thread(read)

    async def sqlite_vec_version(self) -> str | None:
        """sqlite-vec's version as its loaded extension reports it; None when vectors are
        ranked in numpy instead."""

        def read() -> str | None:
            with self._lock:
                reader = self._reader()
                return None if reader is None else reader.version

        return await asyncio.to_thread(read)

    def _close_vectors(self) -> None:
        """Close the sqlite-vec connection (before the main one: the main connection's
        close may checkpoint and remove the WAL); the caller holds `_lock`."""
        reader, self._vector_reader, self._vectors_off = self._vector_reader, None, True
        if reader is not None:
            reader.close()

    async def chunks_by_id(self, ids: list[int]) -> list[ChunkHit]:
        def read(conn: sqlite3.Connection) -> list[ChunkHit]:
            rows = conn.execute(_BY_ID, (json.dumps(ids),)).fetchall()
            return [ChunkHit(r[0], r[1], r[2], r[3]) for r in rows]

        return await self._run(read) if ids else []

    def _purge_vector_stores(self, conn: sqlite3.Connection) -> int:
        rows = conn.execute(Q.expired_stores, (int(self.clock()), PURGE_BATCH)).fetchall()
        for row in rows:
            _drop_store(conn, row[0])
        return len(rows)
