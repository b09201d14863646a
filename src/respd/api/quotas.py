"""Per-identity quotas at the HTTP edge (the counting is `service/quotas.py`'s): the
`x-ratelimit-*` headers on every generating answer while a rate is configured, so clients
can pace themselves before they hit it; Chat's rate admission; stream slots; open
WebSocket connections counted from the upgrade to the close.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from respd.api.errors import refuse, send_error
from respd.api.identity import CURRENT_IDENTITY, owner_of
from respd.service.generation.core import Api, GenerationObserver
from respd.service.generation.output import Usage
from respd.service.quotas import KeyQuotas, QuotaSettings, RateLimited, duration

__all__ = ["EXPOSED_HEADERS", "KeyQuotas", "QuotaSettings", "RateLimited", "stream_slot"]

# The routes that generate, and so spend requests and tokens. A response create is
# counted by the service itself, over every transport; Chat is counted here.
GENERATING = frozenset({"/v1/responses", "/responses", "/v1/chat/completions", "/chat/completions"})
COUNTED_BY_SERVICE = frozenset({"/v1/responses", "/responses"})
# Headers a browser page may read from a cross-origin answer.
EXPOSED_HEADERS = [
    "x-request-id",
    "x-respd-provider",
    "retry-after",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
]
_duration = duration


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
    """Admits Chat requests against their identity's rates; puts the rate headers on every
    generating answer (a response create was admitted by the service by then)."""

    def __init__(self, app: ASGIApp, quotas: KeyQuotas) -> None:
        self.app = app
        self.quotas = quotas

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in GENERATING:
            await self.app(scope, receive, send)
            return
        identity = scope.get("state", {}).get("identity")
        owner = identity.owner if identity is not None else ""
        if scope["path"] not in COUNTED_BY_SERVICE:
            try:
                self.quotas.admit(owner)
            except RateLimited as exc:
                await send_error(scope, send, exc)
                return
        rates = self.quotas.settings.rates

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start" and rates:
                have = {k.lower() for k, _ in message.get("headers", [])}
                if b"retry-after" not in have:  # a 429 carries its own
                    extra = self.quotas.headers(owner).items()
                    message["headers"] = [
                        *message.get("headers", []),
                        *((k.encode(), v.encode()) for k, v in extra),
                    ]
            await send(message)

        await self.app(scope, receive, send_with_headers)


class ConnectionLimits:
    """Counts each identity's open WebSocket connections, from the upgrade to the close;
    an upgrade over the per-key or total cap is refused before it is accepted."""

    def __init__(self, app: ASGIApp, quotas: KeyQuotas) -> None:
        self.app = app
        self.quotas = quotas

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        identity = scope.get("state", {}).get("identity")
        owner = identity.owner if identity is not None else ""
        try:
            self.quotas.open_socket(owner)
        except RateLimited as exc:
            await refuse(scope, receive, send, exc)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.quotas.close_socket(owner)
