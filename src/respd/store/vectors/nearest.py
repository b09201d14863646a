"""The connection through which `SqliteStore.nearest_chunks` ranks vectors with sqlite-vec.

The standard library's `sqlite3` here is built without `enable_load_extension`, so the
extension is loaded into a second connection to the same file, opened read-only through
`sqlean` (a `sqlite3` module with extension loading and its own copy of SQLite).

Two copies of SQLite in one process do not see each other's file locks: POSIX locks never
conflict within a process, and each copy keeps its own table of the locks it holds. So WAL's
promise that a reader keeps its snapshot while the writer checkpoints does not hold between
the two connections, and a second copy opening the shared-memory index (`-shm`) would find
no other user and reset it under the first. Hence:

- the connection is read-only on the file (`mode=ro`) and on its index (`readonly_shm=1`):
  it never writes a byte of either, and, finding the index in use by nobody it can see,
  reads the WAL itself rather than rebuild the index;
- the store runs each of its queries under the lock that already serializes its main
  connection, so a read never overlaps a write or a checkpoint."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class VectorReader:
    """A read-only connection to the store's file with sqlite-vec loaded. Not thread-safe:
    the caller holds the store's lock around every call."""

    def __init__(self, conn: Any, version: str) -> None:
        self._conn = conn
        self.version = version  # sqlite-vec's own `vec_version()`, as the connection reports

    @classmethod
    def open(cls, path: Path) -> VectorReader | None:
        """Connect to `path` and load sqlite-vec; None, with one warning, when `sqlean` or
        `sqlite_vec` is missing or the extension does not load, so that the caller ranks
        in numpy instead."""
        try:
            import sqlean
            import sqlite_vec
        except ImportError as missing:
            log.warning("sqlite-vec unavailable (%s); vectors are ranked in numpy", missing)
            return None
        conn = None
        try:
            uri = path.resolve().as_uri() + "?mode=ro&readonly_shm=1"
            conn = sqlean.connect(uri, uri=True, check_same_thread=False)
            conn.enable_load_extension(True)
            sqlite_vec.load(conn)
            conn.enable_load_extension(False)  # no SQL text may load another one
            version = str(conn.execute("SELECT vec_version()").fetchone()[0])
        except Exception as failed:
            if conn is not None:
                conn.close()
            log.warning("sqlite-vec did not load (%s); vectors are ranked in numpy", failed)
            return None
        log.info(
            "vector search ranks in SQLite %s with sqlite-vec %s", sqlean.sqlite_version, version
        )
        return cls(conn, version)

    def ids(self, sql: str, params: tuple[Any, ...]) -> list[int]:
        """The first column of `sql`'s rows, as ints."""
        cursor = self._conn.execute(sql, params)
        try:
            return [int(row[0]) for row in cursor.fetchall()]
        finally:
            cursor.close()

    def close(self) -> None:
        self._conn.close()
