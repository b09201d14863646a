"""The flags of where state is kept (responses, conversations, background jobs, files) and
for how long."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from respd.store import Limits, Store, redacted
from respd.store import open_store as open_named_store
from respd.store.base import DEFAULT_JOB_LEASE_SECS, DEFAULT_PURGE_INTERVAL_SECS, DEFAULT_TTL_SECS
from respd.store.memory import (
    DEFAULT_CONVERSATIONS_MAX_BYTES,
    DEFAULT_CONVERSATIONS_MAX_ENTRIES,
    DEFAULT_RESPONSES_MAX_BYTES,
    DEFAULT_RESPONSES_MAX_ENTRIES,
    file_limits,
)


def default_data_dir() -> Path:
    """The per-user data directory: XDG on Linux, the platform's usual place elsewhere."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "respd"
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "respd"
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "share") / "respd"


class StoreConfig(BaseModel):
    model_config = ConfigDict(title="Store")

    store: str = Field(
        "sqlite",
        description="Where responses, conversations, background jobs and files are kept: sqlite (a "
        "file in --data-dir; survives restarts), memory (bounded by the --*-store-* flags; lost "
        "on exit), sqlite:///PATH (relative to --data-dir, or sqlite:////abs/path) or "
        "postgresql://USER[:PASSWORD]@HOST[:PORT]/DB (also postgres://; several respd "
        "replicas may share one database).",
    )
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Directory for respd's state (the sqlite store). Default: the per-user "
        "data dir, e.g. ~/.local/share/respd.",
    )
    responses_store_max_entries: int = Field(
        DEFAULT_RESPONSES_MAX_ENTRIES,
        ge=0,
        description="Memory store: most responses kept; 0 disables storing them.",
    )
    responses_store_max_bytes: int = Field(
        DEFAULT_RESPONSES_MAX_BYTES,
        ge=0,
        description="Memory store: approximate JSON bytes of responses kept, oldest evicted "
        "first; 0 keeps the routes but evicts every response at once.",
    )
    responses_store_ttl_secs: int = Field(
        DEFAULT_TTL_SECS,
        ge=0,
        description="Every store: seconds a stored response (with its input items and event "
        "log) is kept after its last write (30 days, as OpenAI); 0 keeps it until deleted.",
    )
    conversation_store_max_entries: int = Field(
        DEFAULT_CONVERSATIONS_MAX_ENTRIES,
        ge=0,
        description="Memory store: most conversations kept; 0 disables conversations.",
    )
    conversation_store_max_bytes: int = Field(
        DEFAULT_CONVERSATIONS_MAX_BYTES,
        ge=0,
        description="Memory store: approximate JSON bytes of conversations kept, oldest evicted "
        "first; 0 keeps the routes but evicts every conversation at once.",
    )
    conversation_store_ttl_secs: int = Field(
        DEFAULT_TTL_SECS,
        ge=0,
        description="Every store: seconds a conversation (with its items) is kept after its "
        "last write; 0 keeps it until deleted.",
    )
    store_purge_interval_secs: float = Field(
        DEFAULT_PURGE_INTERVAL_SECS,
        ge=0,
        description="Seconds between purges of expired records (expired ones are invisible at "
        "once; the purge frees their space); 0 never purges.",
    )
    job_lease_secs: float = Field(
        DEFAULT_JOB_LEASE_SECS,
        gt=0,
        description="Lease of a running background job: the replica running it renews it "
        "every third of this; when a replica dies, its jobs are recorded failed by another "
        "(or the next start) once their lease has run out.",
    )
    files_store_max_bytes: int = Field(
        1073741824,
        ge=0,
        description="Memory store: bytes of uploaded file contents kept, oldest evicted first "
        "(a file larger than this is not kept); 0 keeps the routes but evicts every file at "
        "once.",
    )

    def open_store(self) -> Store:
        """The store `--store` names, bounded by these limits (raises `StoreConfigError`)."""
        return open_named_store(
            self.store,
            self.data_dir.expanduser(),
            responses=Limits(
                self.responses_store_max_entries,
                self.responses_store_max_bytes,
                self.responses_store_ttl_secs,
            ),
            conversations=Limits(
                self.conversation_store_max_entries,
                self.conversation_store_max_bytes,
                self.conversation_store_ttl_secs,
            ),
            files=file_limits(self.files_store_max_bytes),
        )

    def store_location(self) -> str:
        """Where the store is, for the start-up banner (a database password left out)."""
        if self.store == "memory" or self.store.startswith(("postgres:", "postgresql:")):
            return redacted(self.store)
        return f"{self.store} in {self.data_dir}"
