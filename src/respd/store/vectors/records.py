"""What a store keeps for the Vector Stores API: plain records, no API semantics.

A vector store file is a row per (store, file): its status, attributes and chunking; its
chunks (text, and an embedding when a model made one) are written with its final status in
one transaction, so a file is either `completed` with all its chunks or has none."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]

# Statuses of a vector store file (OpenAI's `VectorStoreFile.status`).
IN_PROGRESS = "in_progress"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
FILE_STATUSES = (IN_PROGRESS, COMPLETED, FAILED, CANCELLED)

MAX_QUERY_TERMS = 64


@dataclass
class VectorStoreRecord:
    id: str  # vs_...
    owner: str
    created_at: int
    name: str
    metadata: dict[str, str] = field(default_factory=dict)
    expires_after: JSON | None = None  # {"anchor": "last_active_at", "days": N}
    last_active_at: int = 0
    expires_at: int | None = None
    # Read back only: computed from the store's files when the record is read.
    file_counts: dict[str, int] = field(default_factory=dict)
    usage_bytes: int = 0


@dataclass
class VectorFileRecord:
    vector_store_id: str
    file_id: str
    owner: str
    created_at: int
    filename: str
    status: str = IN_PROGRESS
    attributes: JSON = field(default_factory=dict)
    chunking: JSON = field(default_factory=dict)  # the static strategy object
    last_error: JSON | None = None
    usage_bytes: int = 0
    batch_id: str | None = None


@dataclass
class FileBatchRecord:
    id: str  # vsfb_...
    vector_store_id: str
    owner: str
    created_at: int
    cancelled: bool = False


@dataclass(frozen=True)
class Chunk:
    """One chunk to index: its text and, with an embedding model, its float32 vector."""

    text: str
    embedding: bytes | None = None


@dataclass(frozen=True)
class ChunkHit:
    chunk_id: int
    vector_store_id: str
    file_id: str
    text: str
    score: float = 0.0  # lexical relevance, higher is better (only its order is used)


def file_key(vector_store_id: str, file_id: str) -> str:
    """The key of one (store, file) pair in the search calls' `keys` lists."""
    return f"{vector_store_id}/{file_id}"


def query_terms(text: str) -> list[str]:
    """The distinct words of a query, lower-cased, in order; every store searches these
    (OR-ed), so no query syntax of FTS5 or PostgreSQL reaches the database."""
    seen: dict[str, None] = {}
    for word in re.findall(r"\w+", text.lower()):
        seen.setdefault(word, None)
    return list(seen)[:MAX_QUERY_TERMS]


def file_counts(statuses: list[str]) -> dict[str, int]:
    counts = {status: statuses.count(status) for status in FILE_STATUSES}
    counts["total"] = len(statuses)
    return counts
