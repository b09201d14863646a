"""Per-identity quotas: requests and tokens per minute, and streams open at once.

Windows slide over the last 60 seconds. A request over a quota is a 429 with `retry-after`
and the `x-ratelimit-*` headers OpenAI sends; every generating request carries those headers
while a rate is configured, so clients can pace themselves before they hit it.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from respd.api.errors import send_error
from respd.api.identity import CURRENT_IDENTITY, owner_of
from respd.protocol.errors import APIError
from respd.service.generation.core import Api, GenerationObserver
from respd.service.generation.output import Usage

WINDOW_SECS = 60.0
# The routes that generate, and so spend requests and tokens.
GENERATING = frozenset({"/v1/responses", "/responses", "/v1/chat/completions", "/chat/completions"})
# Headers a browser page may read from a cross-origin answer.
EXPOSED_HEADERS = [
    "x-request-id",
    "retry-after",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
]


class RateLimited(APIError):
    def __init__(self, message: str, headers: dict[str, str]) -> None:
        super().__init__(
            message,
            status_code=429,
            error_type="requests",
            code="rate_limit_exceeded",
            headers=headers,
        )


def _duration(seconds: float) -> str:
    """OpenAI's reset format: `1s`, `6m0s`, `250ms`."""
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    minutes, secs = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


@dataclass(frozen=True)
class QuotaSettings:
    requests_per_minute: int = 0  # 0: no limit
    tokens_per_minute: int = 0
    streams_per_key: int = 0

    @property
    def any(self) -> bool:
        return bool(self.requests_per_minute or self.tokens_per_minute or self.streams_per_key)


class KeyQuotas:
    def __init__(
        self, settings: QuotaSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self.clock = clock
        self._requests: defaultdict[str, deque[float]] = defaultdict(deque)
        self._tokens: defaultdict[str, deque[tuple[float, int]]] = defaultdict(deque)
        self._streams: defaultdict[str, int] = defaultdict(int)

    def _expire(self, owner: str, now: float) -> None:
        requests, tokens = self._requests[owner], self._tokens[owner]
        while requests and requests[0] <= now - WINDOW_SECS:
            requests.popleft()
        while tokens and tokens[0][0] <= now - WINDOW_SECS:
            tokens.popleft()

    def _headers(self, owner: str, now: float) -> dict[str, str]:
        s, headers = self.settings, dict[str, str]()
        if s.requests_per_minute:
            used = self._requests[owner]
            reset = used[0] + WINDOW_SECS - now if used else 0.0
            headers |= {
                "x-ratelimit-limit-requests": str(s.requests_per_minute),
                "x-ratelimit-remaining-requests": str(max(0, s.requests_per_minute - len(used))),
                "x-ratelimit-reset-requests": _duration(reset),
            }
        if s.tokens_per_minute:
            spent = self._tokens[owner]
            reset = spent[0][0] + WINDOW_SECS - now if spent else 0.0
            remaining = s.tokens_per_minute - sum(n for _, n in spent)
            headers |= {
                "x-ratelimit-limit-tokens": str(s.tokens_per_minute),
                "x-ratelimit-remaining-tokens": str(max(0, remaining)),
                "x-ratelimit-reset-tokens": _duration(reset),
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
                f"in {_duration(wait)}.",
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
        """Take one of `owner`'s stream slots, or raise a 429; give it back with
        `close_stream`."""
        limit = self.settings.streams_per_key
        if limit and self._streams[owner] >= limit:
            raise RateLimited(
                f"This API key already has {limit} streams open, the most this server allows "
                "at once. Close one and retry.",
                {"retry-after": "1"},
            )
        self._streams[owner] += 1

    def close_stream(self, owner: str) -> None:
        self._streams[owner] -= 1
        if self._streams[owner] <= 0:
            del self._streams[owner]

    def open_streams(self, owner: str) -> int:
        return self._streams.get(owner, 0)


@contextlib.contextmanager
def stream_slot(request: Request) -> Iterator[Callable[[], None]]:
    """Take a stream slot for the caller's identity (or raise a 429) and yield its release,
    to hand to the stream's response. If no response leaves the block, the slot is given
    back here."""
    quotas: KeyQuotas = request.app.state.quotas
    owner = owner_of(request)
    quotas.open_stream(owner)
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            quotas.close_stream(owner)

    try:
        yield release
    except BaseException:
        release()
        raise


class TokenAccounting:
    """Charges each finished generation's tokens to the identity it ran for (the request's
    context, which a background job's task inherits), then tells `then`."""

    def __init__(self, quotas: KeyQuotas, then: GenerationObserver | None = None) -> None:
        self.quotas = quotas
        self.then = then

    def first_token(self, api: Api, seconds: float) -> None:
        if self.then is not None:
            self.then.first_token(api, seconds)

    def finished(self, api: Api, usage: Usage, seconds: float) -> None:
        owner = CURRENT_IDENTITY.get().owner
        self.quotas.spend(owner, usage.input_tokens + usage.output_tokens)
        if self.then is not None:
            self.then.finished(api, usage, seconds)


class QuotaMiddleware:
    """Admits generating requests against their identity's rates; puts the rate headers on
    the answer."""

    def __init__(self, app: ASGIApp, quotas: KeyQuotas) -> None:
        self.app = app
        self.quotas = quotas

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in GENERATING:
            await self.app(scope, receive, send)
            return
        identity = scope.get("state", {}).get("identity")
        owner = identity.owner if identity is not None else ""
        try:
            headers = self.quotas.admit(owner)
        except RateLimited as exc:
            await send_error(scope, send, exc)
            return
        extra = [(k.encode(), v.encode()) for k, v in headers.items()]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start" and extra:
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)
