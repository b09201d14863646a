"""Resolved media kept by source, so a replayed turn is not fetched, decoded or checked again.

`previous_response_id` chains and conversations hand their earlier items back in their stored
wire shape, and the resolver resolves them again on every turn: without this cache each turn
would re-fetch a remote image, re-decode a base64 payload with Pillow and re-extract a PDF's
text. Entries are the checked results (an `Image`, a `FileText`), never errors, kept least
recently used first out within a byte budget.

Keys name the source, never a request path: a data URL by the SHA-256 of the URL, an http(s)
URL by itself, a stored file by owner, id, creation time and size. A stored file is still
looked up in the store on every use (a deleted or expired one stays a 404); only its decoded
result comes from here, and deleting it drops its entries. What a URL names can change
behind it, so a URL's entry also expires (`--media-url-cache-ttl-secs`).
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from respd.engines.base import Image
from respd.service.media.values import Resolved

DEFAULT_MEDIA_CACHE_MB = 64
DEFAULT_URL_CACHE_TTL_SECS = 600.0

Key = tuple[str | int, ...]
FILE = "file"  # the first element of a stored file's key: (FILE, owner, file_id, ...)
URL = "url"  # the first element of an http(s) URL's key: (URL, kind, url, ...)


@dataclass(frozen=True)
class MediaCacheStats:
    """What `/health` and `/metrics` report."""

    hits: int
    misses: int
    bytes: int
    entries: int
    max_bytes: int


def entry_bytes(value: Resolved) -> int:
    """Memory an entry holds: an image's encoded bytes, a document text's string size."""
    if isinstance(value, Image):
        return len(value.data)
    return sys.getsizeof(value.text) + sys.getsizeof(value.filename)


class MediaCache:
    """An LRU of resolved media bounded by `max_bytes` (0 disables it: every lookup misses).

    Used from the event loop only, so it takes no lock."""

    def __init__(self, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max(0, max_bytes)
        self.clock = clock
        # key -> (value, bytes, expiry on `clock` or None for none)
        self._entries: OrderedDict[Key, tuple[Resolved, int, float | None]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: Key) -> Resolved | None:
        found = self._entries.get(key)
        if found is not None and found[2] is not None and self.clock() >= found[2]:
            self._drop(key)
            found = None
        if found is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return found[0]

    def put(self, key: Key, value: Resolved, ttl: float | None = None) -> None:
        """Keep `value` (for `ttl` seconds when given), evicting the least recently used;
        one larger than the whole budget, or with no time to live, is not kept."""
        size = entry_bytes(value)
        if size > self.max_bytes or (ttl is not None and ttl <= 0):
            return
        self._drop(key)
        self._entries[key] = (value, size, None if ttl is None else self.clock() + ttl)
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def forget_file(self, owner: str, file_id: str) -> None:
        """Drop every entry of a stored file (its content must not outlive its deletion)."""
        for key in [k for k in self._entries if k[:3] == (FILE, owner, file_id)]:
            self._drop(key)

    def stats(self) -> MediaCacheStats:
        return MediaCacheStats(
            self.hits, self.misses, self._bytes, len(self._entries), self.max_bytes
        )

    def _drop(self, key: Key) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
