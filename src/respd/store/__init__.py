"""Persistence: a narrow `Store` protocol (`base.py`) and one module per implementation."""

from __future__ import annotations

from pathlib import Path

from respd.store.base import ConversationRecord, FileRecord, ResponseRecord, Store
from respd.store.memory import Limits, MemoryStore
from respd.store.sqlite import SqliteStore

__all__ = [
    "ConversationRecord",
    "FileRecord",
    "Limits",
    "MemoryStore",
    "ResponseRecord",
    "SqliteStore",
    "Store",
    "open_store",
]

SQLITE_FILE = "respd.sqlite3"


class StoreConfigError(ValueError):
    """`--store` names something this build cannot open."""


def open_store(
    spec: str,
    data_dir: Path,
    *,
    responses: Limits | None = None,
    conversations: Limits | None = None,
    files: Limits | None = None,
) -> Store:
    """`sqlite` (a file in `data_dir`), `sqlite:///PATH`, or `memory` (bounded by the limits)."""
    if spec == "memory":
        return MemoryStore(responses, conversations, files=files)
    if spec == "sqlite":
        return SqliteStore(data_dir / SQLITE_FILE)
    if spec.startswith("sqlite:///"):
        # SQLAlchemy's spelling: sqlite:///rel.db (relative to the data dir), sqlite:////abs.db
        path = Path(spec[len("sqlite:///") :]).expanduser()
        if not path.name:
            raise StoreConfigError("--store sqlite:/// needs a file, e.g. sqlite:///respd.db")
        return SqliteStore(path if path.is_absolute() else data_dir / path)
    if spec.split(":", 1)[0] in ("postgres", "postgresql"):
        raise StoreConfigError(
            "--store postgres:// is not supported yet; use sqlite (the default) or memory"
        )
    raise StoreConfigError(f"unknown --store {spec!r}; expected sqlite, memory or sqlite:///PATH")
