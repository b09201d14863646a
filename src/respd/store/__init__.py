"""Persistence: a narrow `Store` protocol (`base.py`) and one module per implementation."""

from __future__ import annotations

import re
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
    "StoreConfigError",
    "open_store",
    "redacted",
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
    """`sqlite` (a file in `data_dir`), `sqlite:///PATH`, `memory` (bounded by the limits) or
    `postgresql://…` / `postgres://…` (a libpq connection URI).

    The limits' `ttl_secs` is the retention of every store; their entry and byte caps bound
    the memory store only."""
    responses_ttl = responses.ttl_secs if responses else 0
    conversations_ttl = conversations.ttl_secs if conversations else 0
    if spec == "memory":
        return MemoryStore(responses, conversations, files=files)
    if spec == "sqlite":
        return SqliteStore(
            data_dir / SQLITE_FILE,
            responses_ttl_secs=responses_ttl,
            conversations_ttl_secs=conversations_ttl,
        )
    if spec.startswith("sqlite:///"):
        # SQLAlchemy's spelling: sqlite:///rel.db (relative to the data dir), sqlite:////abs.db
        path = Path(spec[len("sqlite:///") :]).expanduser()
        if not path.name:
            raise StoreConfigError("--store sqlite:/// needs a file, e.g. sqlite:///respd.db")
        return SqliteStore(
            path if path.is_absolute() else data_dir / path,
            responses_ttl_secs=responses_ttl,
            conversations_ttl_secs=conversations_ttl,
        )
    if spec.split(":", 1)[0] in ("postgres", "postgresql"):
        # Imported here: psycopg is only loaded by servers that use it.
        import psycopg

        from respd.store.postgres import PostgresStore

        # One plain connection now, so a wrong URI, host or password fails at start-up with
        # the server's own words; the pool itself opens inside the event loop.
        try:
            psycopg.connect(spec, connect_timeout=10).close()
        except (psycopg.Error, ValueError) as exc:
            raise StoreConfigError(f"cannot connect to --store {redacted(spec)}: {exc}") from None
        return PostgresStore(
            spec, responses_ttl_secs=responses_ttl, conversations_ttl_secs=conversations_ttl
        )
    raise StoreConfigError(
        f"unknown --store {spec!r}; expected sqlite, memory, sqlite:///PATH or postgresql://…"
    )


def redacted(spec: str) -> str:
    """`spec` without a password, for logs."""
    spec = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", spec)
    return re.sub(r"(password=)[^&]*", r"\1***", spec)
