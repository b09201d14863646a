"""Store schemas, as append-only lists of migrations: one for SQLite, one for PostgreSQL.

Migration N (1-based) upgrades a database at version N-1 to N. Never edit a shipped entry:
add a new one, so every existing database upgrades in order on the next start.

The two lists are kept apart because the dialects differ where it matters (BLOB/BYTEA,
AUTOINCREMENT/identity columns, cascading foreign keys, ALTER TABLE limits) and each list is
replayed against databases that already exist, so neither can be derived from the other.
They sit side by side here so that a change to one is seen next to the other: both describe
the same tables, and the store contract tests hold them to the same behaviour.
"""

from __future__ import annotations

import sqlite3

MIGRATIONS: list[str] = [
    # 1: responses, their background event logs, conversations and their items.
    """
    CREATE TABLE responses (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        status TEXT NOT NULL,
        background INTEGER NOT NULL,
        previous_response_id TEXT,
        conversation_id TEXT,
        response TEXT NOT NULL,
        input_items TEXT NOT NULL
    );
    CREATE INDEX responses_status ON responses(status);
    CREATE TABLE response_events (
        response_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        event TEXT NOT NULL,
        PRIMARY KEY (response_id, seq)
    );
    CREATE TABLE conversations (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        metadata TEXT NOT NULL
    );
    CREATE TABLE conversation_items (
        pos INTEGER PRIMARY KEY AUTOINCREMENT,
        conversation_id TEXT NOT NULL,
        item_id TEXT NOT NULL,
        item TEXT NOT NULL
    );
    CREATE INDEX conversation_items_conv ON conversation_items(conversation_id, pos);
    """,
    # 2: uploaded files (POST /v1/files): metadata columns and the bytes as a BLOB.
    """
    CREATE TABLE files (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        filename TEXT NOT NULL,
        purpose TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        mime_type TEXT NOT NULL,
        expires_at INTEGER,
        content BLOB NOT NULL
    );
    CREATE INDEX files_owner ON files(owner, created_at);
    CREATE INDEX files_expires ON files(expires_at) WHERE expires_at IS NOT NULL;
    """,
    # 3: retention (the time of the last write, seconds since the epoch) and job leases
    # (the worker holding a running job, until when, and a pending cancel request).
    """
    ALTER TABLE responses ADD COLUMN updated_at REAL NOT NULL DEFAULT 0;
    UPDATE responses SET updated_at = created_at;
    ALTER TABLE responses ADD COLUMN worker TEXT;
    ALTER TABLE responses ADD COLUMN lease_until REAL;
    ALTER TABLE responses ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX responses_updated ON responses(updated_at);
    ALTER TABLE conversations ADD COLUMN updated_at REAL NOT NULL DEFAULT 0;
    UPDATE conversations SET updated_at = created_at;
    CREATE INDEX conversations_updated ON conversations(updated_at);
    """,
    # 4: vector stores, their files (one row per store and file), file batches and chunks,
    # with an FTS5 index over the chunks' text (its rowid is the chunk's id).
    """
    CREATE TABLE vector_stores (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        name TEXT NOT NULL,
        metadata TEXT NOT NULL,
        expires_after TEXT,
        last_active_at INTEGER NOT NULL,
        expires_at INTEGER
    );
    CREATE INDEX vector_stores_owner ON vector_stores(owner, created_at);
    CREATE INDEX vector_stores_expires ON vector_stores(expires_at)
        WHERE expires_at IS NOT NULL;
    CREATE TABLE vector_store_files (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        vector_store_id TEXT NOT NULL,
        file_id TEXT NOT NULL,
        owner TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        filename TEXT NOT NULL,
        status TEXT NOT NULL,
        attributes TEXT NOT NULL,
        chunking TEXT NOT NULL,
        last_error TEXT,
        usage_bytes INTEGER NOT NULL DEFAULT 0,
        batch_id TEXT,
        UNIQUE (vector_store_id, file_id)
    );
    CREATE INDEX vector_store_files_owner ON vector_store_files(owner, vector_store_id);
    CREATE INDEX vector_store_files_status ON vector_store_files(status);
    CREATE TABLE vector_file_batches (
        id TEXT PRIMARY KEY,
        vector_store_id TEXT NOT NULL,
        owner TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        cancelled INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE vector_chunks (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        vector_store_id TEXT NOT NULL,
        file_id TEXT NOT NULL,
        pos INTEGER NOT NULL,
        text TEXT NOT NULL,
        embedding BLOB
    );
    CREATE INDEX vector_chunks_file ON vector_chunks(vector_store_id, file_id, pos);
    CREATE VIRTUAL TABLE vector_chunks_fts USING fts5(text, tokenize = 'porter unicode61')
    """,
]

POSTGRES_MIGRATIONS: list[str] = [
    # 1: the SQLite schema at its version 3, in PostgreSQL's types; event logs and
    # conversation items go with their parent row.
    """
    CREATE TABLE responses (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        status TEXT NOT NULL,
        background BOOLEAN NOT NULL,
        previous_response_id TEXT,
        conversation_id TEXT,
        response TEXT NOT NULL,
        input_items TEXT NOT NULL,
        worker TEXT,
        lease_until DOUBLE PRECISION,
        cancel_requested BOOLEAN NOT NULL DEFAULT FALSE
    );
    CREATE INDEX responses_updated ON responses(updated_at);
    CREATE INDEX responses_unfinished ON responses(worker, lease_until)
        WHERE status IN ('queued', 'in_progress');
    CREATE TABLE response_events (
        response_id TEXT NOT NULL REFERENCES responses(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        event TEXT NOT NULL,
        PRIMARY KEY (response_id, seq)
    );
    CREATE TABLE conversations (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        metadata TEXT NOT NULL
    );
    CREATE INDEX conversations_updated ON conversations(updated_at);
    CREATE TABLE conversation_items (
        pos BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        item_id TEXT NOT NULL,
        item TEXT NOT NULL
    );
    CREATE INDEX conversation_items_conv ON conversation_items(conversation_id, pos);
    CREATE TABLE files (
        id TEXT PRIMARY KEY,
        seq BIGINT GENERATED ALWAYS AS IDENTITY,  -- upload order within one second
        owner TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        filename TEXT NOT NULL,
        purpose TEXT NOT NULL,
        bytes BIGINT NOT NULL,
        mime_type TEXT NOT NULL,
        expires_at BIGINT,
        content BYTEA NOT NULL
    );
    CREATE INDEX files_owner ON files(owner, created_at);
    CREATE INDEX files_expires ON files(expires_at) WHERE expires_at IS NOT NULL;
    """,
    # 2: vector stores (SQLite's version 4); files, batches and chunks go with their store,
    # chunks with their file; chunk text is indexed as an English `tsvector`.
    """
    CREATE TABLE vector_stores (
        id TEXT PRIMARY KEY,
        seq BIGINT GENERATED ALWAYS AS IDENTITY,
        owner TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        name TEXT NOT NULL,
        metadata TEXT NOT NULL,
        expires_after TEXT,
        last_active_at BIGINT NOT NULL,
        expires_at BIGINT
    );
    CREATE INDEX vector_stores_owner ON vector_stores(owner, created_at);
    CREATE INDEX vector_stores_expires ON vector_stores(expires_at)
        WHERE expires_at IS NOT NULL;
    CREATE TABLE vector_store_files (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        vector_store_id TEXT NOT NULL REFERENCES vector_stores(id) ON DELETE CASCADE,
        file_id TEXT NOT NULL,
        owner TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        filename TEXT NOT NULL,
        status TEXT NOT NULL,
        attributes TEXT NOT NULL,
        chunking TEXT NOT NULL,
        last_error TEXT,
        usage_bytes BIGINT NOT NULL DEFAULT 0,
        batch_id TEXT,
        UNIQUE (vector_store_id, file_id)
    );
    CREATE INDEX vector_store_files_owner ON vector_store_files(owner, vector_store_id);
    CREATE INDEX vector_store_files_status ON vector_store_files(status);
    CREATE TABLE vector_file_batches (
        id TEXT PRIMARY KEY,
        vector_store_id TEXT NOT NULL REFERENCES vector_stores(id) ON DELETE CASCADE,
        owner TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        cancelled BOOLEAN NOT NULL DEFAULT FALSE
    );
    CREATE TABLE vector_chunks (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        vector_store_id TEXT NOT NULL,
        file_id TEXT NOT NULL,
        pos INTEGER NOT NULL,
        text TEXT NOT NULL,
        embedding BYTEA,
        tsv TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', text)) STORED,
        FOREIGN KEY (vector_store_id, file_id)
            REFERENCES vector_store_files(vector_store_id, file_id) ON DELETE CASCADE
    );
    CREATE INDEX vector_chunks_file ON vector_chunks(vector_store_id, file_id, pos);
    CREATE INDEX vector_chunks_tsv ON vector_chunks USING GIN (tsv)
    """,
]


def statements(script: str) -> list[str]:
    """The statements of one migration (none of them holds a literal `;`)."""
    return [s for s in script.split(";") if s.strip()]


def newer_than_known(version: int, known: int) -> RuntimeError:
    return RuntimeError(
        f"the database is at schema version {version}, newer than this respd understands "
        f"({known}); upgrade respd"
    )


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the SQLite schema to the newest version, each step in its own transaction."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    version = row[0] if row else 0
    if row is None:
        conn.execute("INSERT INTO schema_version (version) VALUES (0)")
        conn.commit()
    if version > len(MIGRATIONS):
        raise newer_than_known(version, len(MIGRATIONS))
    for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
        # One explicit transaction (DDL included): the step and its version bump land together.
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in statements(script):
                conn.execute(statement)
            conn.execute("UPDATE schema_version SET version = ?", (number,))
        except BaseException:
            conn.rollback()
            raise
        conn.commit()
    return len(MIGRATIONS)
