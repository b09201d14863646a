"""Who is asking. Every stored object is owned by, and only visible to, one identity.

With no API keys configured every request is the one anonymous identity. With keys, a
request must present one (`Authorization: Bearer KEY` or `X-Api-Key: KEY`); its identity is
the key's label when the keys file gives one, else a hash of the key, so keys are never
stored or logged in clear.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from respd.api.errors import refuse
from respd.logs import set_log_identity
from respd.protocol.errors import APIError
from respd.service.generation.admission import LANE

log = logging.getLogger(__name__)

ANONYMOUS = "anonymous"
# Routes that hold no one's data: a health probe and the API description. `/metrics` checks
# the operators' key itself, as do the operators' routes (`operator_route`).
PUBLIC_PATHS = frozenset(
    {
        "/health",
        "/v1/health",
        "/metrics",
        "/openapi.json",
        "/docs",
        "/redoc",
        "/",
    }
)
# The playground's static files: the page asks for a key itself, once it has loaded.
PUBLIC_PREFIXES = ("/playground/",)


@dataclass(frozen=True)
class Identity:
    owner: str  # what stored objects are keyed by
    label: str  # what logs show


ANONYMOUS_IDENTITY = Identity(ANONYMOUS, "-")
# The identity of the request being served, for code that runs on its behalf without the
# request at hand (token accounting at the end of a generation, a background job's task).
CURRENT_IDENTITY: contextvars.ContextVar[Identity] = contextvars.ContextVar(
    "respd_identity", default=ANONYMOUS_IDENTITY
)


class Unauthorized(APIError):
    """The one answer for a missing and a wrong key, so neither can be told apart."""

    def __init__(self) -> None:
        super().__init__(
            "Incorrect or missing API key. Send it as 'Authorization: Bearer KEY' or "
            "'X-Api-Key: KEY'.",
            status_code=401,
            code="invalid_api_key",
            headers={"www-authenticate": "Bearer"},
        )


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_keys_file(text: str) -> list[tuple[str, str | None]]:
    """`KEY [LABEL]` per line; blank lines and `#` comments skipped."""
    keys: list[tuple[str, str | None]] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, _, label = line.partition(" ")
        keys.append((key, label.strip() or None))
    return keys


class KeyRing:
    """The accepted keys, as SHA-256 digests mapped to identities. Lookups compare the
    presented key's digest with every stored digest in constant time."""

    def __init__(self, keys: Iterable[str] = (), keys_file: Path | None = None) -> None:
        self._flag_keys = list(keys)
        self._file = keys_file
        self._lock = threading.Lock()
        self._entries: list[tuple[bytes, Identity]] = []
        self.reload()

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    def reload(self) -> None:
        """Read the keys again (the file may have changed). A file that cannot be read
        keeps the keys in force and is logged, so a bad edit never opens the server."""
        pairs: list[tuple[str, str | None]] = [(k, None) for k in self._flag_keys]
        if self._file is not None:
            try:
                pairs += parse_keys_file(self._file.read_text())
            except OSError as exc:
                if self._entries:
                    log.error("cannot re-read the API keys file, keeping the old keys: %s", exc)
                    return
                raise
        entries = []
        for key, label in pairs:
            digest = _digest(key)
            owner = f"label:{label}" if label else f"key:{digest.hex()[:32]}"
            entries.append((digest, Identity(owner, label or f"key-{digest.hex()[:8]}")))
        with self._lock:
            self._entries = entries
        log.info("%d API key(s) in force", len(entries))

    def identify(self, presented: str | None) -> Identity | None:
        if not presented:
            return None
        digest = _digest(presented)
        with self._lock:
            entries = self._entries
        found = None
        for stored, identity in entries:  # no early exit: the time does not depend on which
            if hmac.compare_digest(stored, digest):
                found = identity
        return found


def presented_key(headers: dict[bytes, bytes]) -> str | None:
    auth = headers.get(b"authorization", b"").decode("latin-1")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    key = headers.get(b"x-api-key", b"").decode("latin-1").strip()
    return key or None


class AuthMiddleware:
    """Puts the caller's identity in the request state, or answers 401."""

    def __init__(self, app: ASGIApp, keys: KeyRing) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        identity = self._identity(scope)
        if identity is None:
            # A WebSocket presents its key on the upgrade request, refused before any message.
            await refuse(scope, receive, send, Unauthorized())
            return
        scope.setdefault("state", {})["identity"] = identity
        CURRENT_IDENTITY.set(identity)
        LANE.set(identity.owner)  # the engines' queue is shared fairly between identities
        set_log_identity(identity.label)
        await self.app(scope, receive, send)

    def _identity(self, scope: Scope) -> Identity | None:
        if not self.keys.enabled:
            return ANONYMOUS_IDENTITY
        if scope["type"] == "http" and (
            scope["path"] in PUBLIC_PATHS
            or scope["path"].startswith(PUBLIC_PREFIXES)
            or operator_route(scope["path"])
            or scope["method"] == "OPTIONS"
        ):
            return ANONYMOUS_IDENTITY  # a CORS preflight carries no credentials
        return self.keys.identify(presented_key(dict(scope.get("headers") or [])))


def identity_of(request: HTTPConnection) -> Identity:
    identity = getattr(request.state, "identity", None)
    return identity if isinstance(identity, Identity) else ANONYMOUS_IDENTITY


def owner_of(request: HTTPConnection) -> str:
    return identity_of(request).owner


def operator_route(path: str) -> bool:
    """The routing table and loading or unloading a model: operators' routes."""
    if path == "/v1/providers":
        return True
    return path.startswith("/v1/models/") and path.endswith(("/load", "/unload"))


def require_metrics_key(request: HTTPConnection) -> bool:
    """With `--metrics-api-key` set, the request must present it (else a 401); returns
    whether one is set."""
    key: str | None = getattr(request.app.state, "metrics_api_key", None)
    if key is None:
        return False
    presented = presented_key(dict(request.scope.get("headers") or []))
    if presented is None or not hmac.compare_digest(presented.encode(), key.encode()):
        raise Unauthorized()
    return True


def require_operator(request: HTTPConnection) -> None:
    """Operators' routes (the routing table, loading models): with `--metrics-api-key` set
    only that key passes, else any API key the server takes (any caller on a server
    without keys). Such routes are public to the key middleware and call this."""
    if require_metrics_key(request):
        return
    keys: KeyRing = request.app.state.keys
    if (
        keys.enabled
        and keys.identify(presented_key(dict(request.scope.get("headers") or []))) is None
    ):
        raise Unauthorized()
