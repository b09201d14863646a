"""Per-identity quotas, whatever the transport: requests and tokens per minute, work open at
once (streams, WebSocket responses and background jobs share one budget), queued background
jobs, open WebSocket connections, and stored bytes.

Windows slide over the last 60 seconds. A request over a quota is a 429 (`RateLimited`) with
`retry-after`; the HTTP layer adds the `x-ratelimit-*` headers OpenAI sends (`headers`).
Counters live in this process: each replica bounds its own share.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from respd.protocol.errors import APIError

WINDOW_SECS = 60.0


class StoreUsage(Protocol):
    async def owner_bytes(self, owner: str) -> int: ...


class RateLimited(APIError):
    def __init__(
        self, message: str, headers: dict[str, str], *, code: str = "rate_limit_exceeded"
    ) -> None:
        super().__init__(
            message, status_code=429, error_type="requests", code=code, headers=headers
        )


class StorageFull(APIError):
    """The key's stored bytes would pass `--max-storage-bytes-per-key`: a 413 for an upload
    that does not fit, a 429 for a response to store once the quota is spent."""

    def __init__(self, used: int, adding: int, limit: int) -> None:
        more = f"; {adding} more would pass" if adding else ", which reaches"
        super().__init__(
            f"This API key stores {used} bytes{more} its storage quota of {limit} bytes. "
            "Delete stored files or responses (or send store: false) and retry.",
            status_code=413 if adding else 429,
            error_type="insufficient_quota",
            code="storage_quota_exceeded",
        )


def duration(seconds: float) -> str:
    """OpenAI's reset format: `1s`, `6m0s`, `250ms`."""
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    minutes, secs = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


@dataclass(frozen=True)
class QuotaSettings:
    requests_per_minute: int = 0  # 0: no limit, for every field
    tokens_per_minute: int = 0
    streams_per_key: int = 0  # streams, WebSocket responses and background jobs together
    background_per_key: int = 0  # background jobs not yet finished
    storage_bytes_per_key: int = 0  # files + stored responses
    sockets_per_key: int = 0  # open WebSocket connections
    sockets_total: int = 0

    @property
    def rates(self) -> bool:
        return bool(self.requests_per_minute or self.tokens_per_minute)

    @property
    def any(self) -> bool:
        return any(vars(self).values())


class Counter:
    """How many of something each identity holds, bounded by `limit` (0: none)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held: defaultdict[str, int] = defaultdict(int)

    def take(self, owner: str) -> bool:
        if self.limit and self.held[owner] >= self.limit:
            return False
        self.held[owner] += 1
        return True

    def give(self, owner: str) -> None:
        self.held[owner] -= 1
        if self.held[owner] <= 0:
            del self.held[owner]

    def __getitem__(self, owner: str) -> int:
        return self.held.get(owner, 0)


class KeyQuotas:
    def __init__(
        self, settings: QuotaSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self.clock = clock
        self._requests: defaultdict[str, deque[float]] = defaultdict(deque)
        self._tokens: defaultdict[str, deque[tuple[float, int]]] = defaultdict(deque)
        self.streams = Counter(settings.streams_per_key)
        self.background = Counter(settings.background_per_key)
        self.sockets = Counter(settings.sockets_per_key)

    def _expire(self, owner: str, now: float) -> None:
        requests, tokens = self._requests[owner], self._tokens[owner]
        while requests and requests[0] <= now - WINDOW_SECS:
            requests.popleft()
        while tokens and tokens[0][0] <= now - WINDOW_SECS:
            tokens.popleft()

    def headers(self, owner: str) -> dict[str, str]:
        """The `x-ratelimit-*` headers of `owner`'s rates as they stand."""
        now = self.clock()
        self._expire(owner, now)
        return self._headers(owner, now)

    def _headers(self, owner: str, now: float) -> dict[str, str]:
        s, headers = self.settings, dict[str, str]()
        if s.requests_per_minute:
            used = self._requests[owner]
            reset = used[0] + WINDOW_SECS - now if used else 0.0
            headers |= {
                "x-ratelimit-limit-requests": str(s.requests_per_minute),
                "x-ratelimit-remaining-requests": str(max(0, s.requests_per_minute - len(used))),
                "x-ratelimit-reset-requests": duration(reset),
            }
        if s.tokens_per_minute:
            spent = self._tokens[owner]
            reset = spent[0][0] + WINDOW_SECS - now if spent else 0.0
            remaining = s.tokens_per_minute - sum(n for _, n in spent)
            headers |= {
                "x-ratelimit-limit-tokens": str(s.tokens_per_minute),
                "x-ratelimit-remaining-tokens": str(max(0, remaining)),
                "x-ratelimit-reset-tokens": duration(reset),
            }
        return headers

    def admit(self, owner: str) -> dict[str, str]:
        """Count one generating request for `owner`; its headers, or a 429."""
        s, now = self.settings, self.clock()
        self._expire(owner, now)
        requests, tokens = self._requests[owner], self._tokens[owner]
        waits = []
        if s.requests_per_minute and len(requests) >= s.requests_per_minute:
            waits.append(("requests", requests[0] + WINDOW_SECS - now))
        if s.tokens_per_minute and sum(n for _, n in tokens) >= s.tokens_per_minute:
            waits.append(("tokens", tokens[0][0] + WINDOW_SECS - now))
        if waits:
            kind, wait = max(waits, key=lambda w: w[1])
            headers = self._headers(owner, now) | {"retry-after": str(max(1, math.ceil(wait)))}
            limit = s.requests_per_minute if kind == "requests" else s.tokens_per_minute
            raise RateLimited(
                f"Rate limit reached: {limit} {kind} per minute for this API key. Try again "
                f"in {duration(wait)}.",
                headers,
            )
        if s.requests_per_minute:
            requests.append(now)
        return self._headers(owner, now)

    def spend(self, owner: str, tokens: int) -> None:
        """Record tokens a finished generation used (input + output)."""
        if self.settings.tokens_per_minute and tokens > 0:
            self._tokens[owner].append((self.clock(), tokens))

    def open_stream(self, owner: str) -> None:
        """Take one of `owner`'s slots for work held open (a stream, a WebSocket response,
        a background job), or raise a 429; give it back with `close_stream`."""
        if not self.streams.take(owner):
            raise RateLimited(
                f"This API key already has {self.streams.limit} streams, WebSocket responses "
                "or background responses running, the most this server allows at once. "
                "Wait for one to finish and retry.",
                {"retry-after": "1"},
            )

    def close_stream(self, owner: str) -> None:
        self.streams.give(owner)

    def open_streams(self, owner: str) -> int:
        return self.streams[owner]

    def hold(self, owner: str, *, background: bool = False) -> Callable[[], None]:
        """A slot of `owner`'s budget (and, for a `background` job, one of its background
        places), or a 429; returns the release, which may be called more than once."""
        if background and not self.background.take(owner):
            raise RateLimited(
                f"This API key already has {self.background.limit} background responses "
                "queued or running, the most this server allows. Wait for one to finish "
                "and retry.",
                {"retry-after": "1"},
                code="too_many_background_responses",
            )
        try:
            self.open_stream(owner)
        except RateLimited:
            if background:
                self.background.give(owner)
            raise
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.close_stream(owner)
                if background:
                    self.background.give(owner)

        return release

    def open_socket(self, owner: str) -> None:
        """Count one open WebSocket connection, or raise a 429 (per key or in total)."""
        total = self.settings.sockets_total
        if total and sum(self.sockets.held.values()) >= total:
            raise RateLimited(
                f"This server already holds {total} WebSocket connections, the most it "
                "allows; retry shortly.",
                {"retry-after": "1"},
                code="too_many_connections",
            )
        if not self.sockets.take(owner):
            raise RateLimited(
                f"This API key already holds {self.sockets.limit} WebSocket connections, the "
                "most this server allows; close one and retry.",
                {"retry-after": "1"},
                code="too_many_connections",
            )

    def close_socket(self, owner: str) -> None:
        self.sockets.give(owner)

    async def check_storage(self, store: StoreUsage, owner: str, adding: int = 0) -> None:
        """Raise `StorageFull` when `owner` storing `adding` more bytes (a response: 0, its
        size unknown yet) would pass the storage quota."""
        limit = self.settings.storage_bytes_per_key
        if not limit:
            return
        used = await store.owner_bytes(owner)
        if used + adding > limit or (not adding and used >= limit):
            raise StorageFull(used, adding, limit)
