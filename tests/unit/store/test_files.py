"""The file methods of both store classes directly: expiry, eviction, owners, the schema
upgrade (the Files API over HTTP is tested against real servers in
tests/integration/test_files.py)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from respd.protocol.errors import NotFound
from respd.service.files import read_file
from respd.store import MemoryStore, SqliteStore
from respd.store.base import FileRecord, ResponseRecord, Store
from respd.store.memory import file_limits
from respd.store.migrations import MIGRATIONS


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _file(
    fid: str, owner: str = "anon", *, size: int = 3, expires_at: int | None = None
) -> FileRecord:
    return FileRecord(
        id=fid,
        owner=owner,
        created_at=int(time.time()),
        filename=f"{fid}.txt",
        purpose="user_data",
        bytes=size,
        mime_type="text/plain",
        expires_at=expires_at,
    )


@pytest.fixture(params=["memory", "sqlite"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "s.db")


def test_store_hides_expired_files(any_store: Store, tmp_path: Path) -> None:
    now = int(time.time())

    async def go() -> None:
        await any_store.save_file(_file("file-old", expires_at=now - 5), b"old")
        await any_store.save_file(_file("file-new", expires_at=now + 3600), b"new")
        await any_store.save_file(_file("file-kept"), b"kept")
        assert await any_store.get_file("anon", "file-old") is None
        assert await any_store.file_content("anon", "file-old") is None
        assert not await any_store.delete_file("anon", "file-old")
        assert [f.id for f in await any_store.list_files("anon")] == ["file-new", "file-kept"]
        assert await any_store.file_content("anon", "file-new") == b"new"
        with pytest.raises(NotFound) as exc:
            await read_file(any_store, "anon", "file-old", param="input[0].content[1].file_id")
        assert exc.value.param == "input[0].content[1].file_id" and exc.value.status_code == 404
        record, content = await read_file(any_store, "anon", "file-new", param="x")
        assert record.id == "file-new" and content == b"new"
        # Expired rows are purged, not only hidden: the next write removes them.
        await any_store.save_file(_file("file-later", expires_at=now - 1), b"later")
        if isinstance(any_store, MemoryStore):
            assert any_store.files.bytes == len(b"new") + len(b"kept")
        else:
            await any_store.close()
            conn = sqlite3.connect(tmp_path / "s.db")
            ids = {r[0] for r in conn.execute("SELECT id FROM files")}
            conn.close()
            assert ids == {"file-new", "file-kept"}

    _run(go())


def test_memory_files_are_bounded_by_content_bytes() -> None:
    store = MemoryStore(files=file_limits(10))

    async def go() -> None:
        await store.save_file(_file("file-a", size=6), b"aaaaaa")
        await store.save_file(_file("file-b", size=4), b"bbbb")
        assert [f.id for f in await store.list_files("anon")] == ["file-a", "file-b"]
        await store.save_file(_file("file-c", size=1), b"c")  # 11 > 10: the oldest goes
        assert [f.id for f in await store.list_files("anon")] == ["file-b", "file-c"]
        assert await store.file_content("anon", "file-a") is None
        assert store.files.bytes == 5
        # An expired file's bytes are purged before they could evict a live file.
        await store.save_file(_file("file-x", size=5, expires_at=int(time.time()) - 1), b"xxxxx")
        await store.save_file(_file("file-d", size=5), b"ddddd")
        assert [f.id for f in await store.list_files("anon")] == ["file-b", "file-c", "file-d"]
        zero = MemoryStore(files=file_limits(0))  # 0 keeps the routes but keeps no file
        await zero.save_file(_file("file-z", size=1), b"z")
        assert await zero.get_file("anon", "file-z") is None

    _run(go())


def test_memory_file_expires_on_the_wall_clock() -> None:
    now = [1_000_000.0]
    store = MemoryStore(wall_clock=lambda: now[0])

    async def go() -> None:
        await store.save_file(_file("file-a", expires_at=1_000_060), b"abc")
        assert await store.file_content("anon", "file-a") == b"abc"
        now[0] += 59
        assert [f.id for f in await store.list_files("anon")] == ["file-a"]
        now[0] += 1  # at expires_at: gone, and its bytes freed on that read
        assert await store.list_files("anon") == []
        assert await store.get_file("anon", "file-a") is None
        assert store.files.bytes == 0

    _run(go())


def test_sqlite_upgrades_a_version_1_database(tmp_path: Path) -> None:
    """A data dir from before the files table gets it on the next start, its rows intact."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE schema_version (version INTEGER NOT NULL);"
        "INSERT INTO schema_version VALUES (1);" + MIGRATIONS[0]
    )
    conn.execute(
        "INSERT INTO responses VALUES ('resp_1', 'anon', 1, 'completed', 0, NULL, NULL, ?, '[]')",
        ('{"id": "resp_1", "status": "completed", "output": []}',),
    )
    conn.commit()
    conn.close()

    async def go() -> None:
        store = SqliteStore(path)
        record = await store.get_response("anon", "resp_1")
        assert isinstance(record, ResponseRecord) and record.status == "completed"
        await store.save_file(_file("file-a"), b"abc")
        assert await store.file_content("anon", "file-a") == b"abc"
        await store.close()

    _run(go())
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == len(MIGRATIONS)
    conn.close()
