"""The web playground: a static single-page app at `/` that talks to this server's own API.

The assets are plain HTML, ES modules and CSS shipped inside the package, so serving them
needs no build step and no Node. They stay out of the OpenAPI schema: they are not API."""

from __future__ import annotations

import hashlib
from importlib.resources import files
from pathlib import PurePosixPath

from fastapi import APIRouter, Header
from fastapi.responses import Response

from respd.protocol.errors import NotFound

router = APIRouter()

ASSETS = files("respd.api") / "playground"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# The page and its modules change with each release but keep their names: the browser
# revalidates them on each load (an ETag makes that a 304) rather than run a stale mix.
CACHE = "no-cache"
# Nothing on the page comes from elsewhere, and nothing may: a strict policy keeps an
# injected script or a stray remote URL from working.
CSP = (
    "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)


def _asset(name: str) -> bytes | None:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or path.suffix not in CONTENT_TYPES:
        return None
    resource = ASSETS.joinpath(*path.parts)
    return resource.read_bytes() if resource.is_file() else None


def _serve(name: str, if_none_match: str | None) -> Response:
    body = _asset(name)
    if body is None:
        raise NotFound(f"No playground asset named '{name}'.")
    etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
    headers = {
        "Cache-Control": CACHE,
        "ETag": etag,
        "Content-Security-Policy": CSP,
        "X-Content-Type-Options": "nosniff",
    }
    if if_none_match == etag:
        return Response(status_code=304, headers=headers)
    media = CONTENT_TYPES[PurePosixPath(name).suffix]
    return Response(body, media_type=media, headers=headers)


@router.get("/", include_in_schema=False)
async def page(if_none_match: str | None = Header(None)) -> Response:
    return _serve("index.html", if_none_match)


@router.get("/playground/{name:path}", include_in_schema=False)
async def asset(name: str, if_none_match: str | None = Header(None)) -> Response:
    return _serve(name, if_none_match)
