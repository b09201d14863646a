"""What a request must look like before any route reads it: a Host this server answers to,
an Origin it trusts, a JSON content type on JSON routes, a bounded body.

A server on 127.0.0.1 is reachable from every web page its user opens. A foreign Host
header means DNS rebinding; a foreign Origin means another site's page; a `text/plain` or
form body is what a page can send across sites without a CORS preflight. Each is refused
before anything runs or is stored.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from respd.api.encoding import decode_body, encodings
from respd.api.errors import refuse, send_error
from respd.protocol.errors import APIError
from respd.service.limits import DEFAULT_MAX_REQUEST_BYTES

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
# Routes whose body is multipart (uploads); every other body is JSON.
UPLOAD_PATHS = frozenset({"/v1/files"})
# An upload's multipart framing around the file itself.
MULTIPART_OVERHEAD = 1 << 20


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_allowed_hosts(bind: str) -> list[str]:
    """Loopback names only when bound to loopback; any Host otherwise (a proxy in front
    decides)."""
    return list(LOOPBACK_HOSTS) if is_loopback(bind) else ["*"]


def _hostname(host: str) -> str:
    """`example.com:8080` → `example.com`; `[::1]:8080` → `::1`."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class TooLarge(APIError):
    def __init__(self, limit: int, *, upload: bool = False) -> None:
        super().__init__(
            f"The request body is larger than this server accepts ({limit} bytes).",
            status_code=413,
            code="file_too_large" if upload else "request_too_large",
        )


@dataclass
class GuardSettings:
    allowed_hosts: Sequence[str] = ("*",)
    cors_origins: Sequence[str] = ()
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_upload_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    upload_paths: frozenset[str] = field(default=UPLOAD_PATHS)


class RequestGuard:
    """Refuses foreign hosts (400), untrusted origins (403), non-JSON bodies on JSON
    routes (415; an upload route refuses a body that is not multipart itself) and bodies
    over the limit (413), in OpenAI's error shape."""

    def __init__(self, app: ASGIApp, settings: GuardSettings) -> None:
        self.app = app
        self.settings = settings
        self.any_host = "*" in settings.allowed_hosts
        self.hosts = {h.lower().strip("[]") for h in settings.allowed_hosts}
        self.any_origin = "*" in settings.cors_origins
        self.origins = {o.rstrip("/").lower() for o in settings.cors_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            # Browsers let any page open a socket to 127.0.0.1: the same Host and Origin
            # checks, at the upgrade.
            headers = dict(scope.get("headers") or [])
            host = headers.get(b"host", b"").decode("latin-1").lower()
            if (problem := self._foreign(headers, host)) is not None:
                await refuse(scope, receive, send, problem)
                return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host", b"").decode("latin-1").lower()
        upload = scope["path"] in self.settings.upload_paths
        limit = self.settings.max_upload_bytes if upload else self.settings.max_request_bytes
        problem = self._check(scope, headers, host, upload, limit)
        coded = headers.get(b"content-encoding")
        if problem is None and coded is not None:
            try:
                receive, scope = await _decoded(scope, receive, coded, limit, upload)
            except APIError as exc:
                problem = exc
        if problem is not None:
            await send_error(scope, send, problem)
            return
        await self.app(scope, _bounded(receive, limit, upload), send)

    def _foreign(self, headers: dict[bytes, bytes], host: str) -> APIError | None:
        """A Host this server does not answer to, or an Origin it does not trust."""
        if not self.any_host and _hostname(host) not in self.hosts:
            return APIError(
                f"Host '{host}' is not served here; allow it with --allowed-hosts.",
                code="invalid_host",
            )
        origin = headers.get(b"origin")
        if origin is not None and not self._trusted(origin.decode("latin-1"), host):
            return APIError(
                "Requests from this web origin are not allowed; allow it with --cors-origins.",
                status_code=403,
                code="origin_not_allowed",
            )
        return None

    def _check(
        self, scope: Scope, headers: dict[bytes, bytes], host: str, upload: bool, limit: int
    ) -> APIError | None:
        if (problem := self._foreign(headers, host)) is not None:
            return problem
        length = headers.get(b"content-length")
        has_body = b"transfer-encoding" in headers or (length is not None and length != b"0")
        # Upload routes check their own (multipart) content type.
        if has_body and not upload and scope["method"] in ("POST", "PUT", "PATCH"):
            kind = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip()
            if kind.lower() != "application/json" and not kind.lower().endswith("+json"):
                return APIError(
                    f"Unsupported content type '{kind or 'none'}': send 'application/json'.",
                    status_code=415,
                    code="unsupported_media_type",
                )
        if length is not None and length.isdigit() and int(length) > limit:
            return TooLarge(limit, upload=upload)
        return None

    def _trusted(self, origin: str, host: str) -> bool:
        if self.any_origin or origin.rstrip("/").lower() in self.origins:
            return True
        return urlsplit(origin).netloc.lower() == host  # same origin: a page served here


async def _decoded(
    scope: Scope, receive: Receive, coded: bytes, limit: int, upload: bool
) -> tuple[Receive, Scope]:
    """For a body with a `Content-Encoding` (`coded`): read it whole (bounded), decode it,
    and hand the route a plain body under headers that no longer announce an encoding."""
    names = encodings(coded.decode("latin-1"))
    if not names:  # identity only
        return receive, scope
    raw = bytearray()
    more = True
    bounded = _bounded(receive, limit, upload)
    while more:
        message = await bounded()
        if message["type"] != "http.request":
            break
        raw += message.get("body", b"")
        more = message.get("more_body", False)
    body = decode_body(bytes(raw), names, limit, TooLarge(limit, upload=upload))
    drop = {b"content-encoding", b"content-length"}
    headers = [(k, v) for k, v in scope.get("headers") or [] if k.lower() not in drop]
    headers.append((b"content-length", str(len(body)).encode()))
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay, {**scope, "headers": headers}


def _bounded(receive: Receive, limit: int, upload: bool) -> Receive:
    """`receive`, failing once the body passes `limit` bytes (a chunked body has no
    content-length to check up front)."""
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise TooLarge(limit, upload=upload)
        return message

    return wrapped
