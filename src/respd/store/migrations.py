"""SQLite schema, as an append-only list of migrations.

Migration N (1-based) upgrades a database at version N-1 to N. Never edit a shipped entry:
add a new one, so every existing data dir upgrades in order on the next start.
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
]


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the schema to the newest version, each step in its own transaction."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    version = row[0] if row else 0
    if row is None:
        conn.execute("INSERT INTO schema_version (version) VALUES (0)")
        conn.commit()
    if version > len(MIGRATIONS):
        raise RuntimeError(
            f"the data dir's database is at schema version {version}, newer than this respd "
            f"understands ({len(MIGRATIONS)}); upgrade respd"
        )
    for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
        # One explicit transaction (DDL included): the step and its version bump land together.
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in filter(str.strip, script.split(";")):
                conn.execute(statement)
            conn.execute("UPDATE schema_version SET version = ?", (number,))
        except BaseException:
            conn.rollback()
            raise
        conn.commit()
    return len(MIGRATIONS)
