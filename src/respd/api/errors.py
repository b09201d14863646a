"""Every error leaves as `{"error": {"message", "type", "param", "code"}}`, with `x-request-id`."""

from __future__ import annotations

import logging
import secrets
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from respd.api.streaming import ClientGone
from respd.logs import request_context
from respd.protocol.errors import APIError, InvalidRequest, MissingParameter

log = logging.getLogger(__name__)

# Tags pydantic puts in error locations for union members, not field names.
_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _param_from_loc(loc: tuple[Any, ...]) -> str | None:
    parts: list[str] = []
    for piece in loc:
        if isinstance(piece, int):
            if parts:
                parts[-1] += f"[{piece}]"
            continue
        text = str(piece)
        if text.lower() in _UNION_TAGS or "[" in text or "-" in text or "," in text:
            continue
        parts.append(text)
    return ".".join(parts) or None


def validation_error(exc: ValidationError | RequestValidationError) -> InvalidRequest:
    """The first pydantic error, phrased and located the way OpenAI phrases them."""
    err = exc.errors()[0]
    param = _param_from_loc(tuple(err.get("loc", ())))
    if err.get("type") == "missing":
        return MissingParameter(param)
    return InvalidRequest(
        f"Invalid value for '{param}': {err.get('msg', 'invalid value')}.",
        param=param,
        code="invalid_type" if "type" in str(err.get("type", "")) else "invalid_value",
    )


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = (
                f"Unknown request URL: {request.method} {request.url.path}. "
                "Please check the URL for typos."
            )
            code = "unknown_url"
        elif exc.status_code == 405:
            message = f"Method {request.method} is not allowed on {request.url.path}."
            code = "method_not_allowed"
        else:
            message, code = str(exc.detail), None
        return error_response(
            APIError(
                message, status_code=exc.status_code, code=code, headers=dict(exc.headers or {})
            )
        )

    @app.exception_handler(ClientGone)
    @app.exception_handler(ClientDisconnect)
    async def _gone(_: Request, __: Exception) -> Response:
        # Nobody reads this; 499 (nginx's "client closed request") keeps the access log honest.
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(
            APIError(
                "The server had an error while processing your request.",
                status_code=500,
                error_type="server_error",
                code="server_error",
            )
        )


class RequestIdMiddleware:
    """Gives every response an `x-request-id` (the client's own if it sent one)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope.get("headers") or []).get(b"x-request-id")
        request_id = incoming or f"req_{secrets.token_hex(16)}".encode()
        scope.setdefault("state", {})["request_id"] = request_id.decode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                headers.append((b"x-request-id", request_id))
                message["headers"] = headers
            await send(message)

        with request_context(scope["state"]["request_id"]):  # every log line names it
            await self.app(scope, receive, send_with_id)


async def send_error(scope: Scope, send: Send, exc: APIError) -> None:
    """Answer with `exc` from a middleware, before any route runs."""
    await error_response(exc)(scope, _no_body, send)


async def refuse(scope: Scope, receive: Receive, send: Send, exc: APIError) -> None:
    """Refuse a request from a middleware: an HTTP request gets `exc` as its answer; a
    WebSocket upgrade is closed before it is accepted (the client sees HTTP 403)."""
    if scope["type"] == "websocket":
        await receive()  # the client's connect
        await send({"type": "websocket.close", "code": 1008, "reason": exc.message[:120]})
        return
    await send_error(scope, send, exc)


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}
