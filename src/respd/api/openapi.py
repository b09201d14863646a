"""The served OpenAPI document, describing what the routes really take and answer.

Routes read their bodies themselves (to give OpenAI-shaped errors and to ignore unknown
fields), so FastAPI cannot see them; this adds each body's schema, the multipart upload,
the event streams, and the errors every route can answer with, in place of the 422 that
FastAPI documents but this server never sends.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from respd.protocol.chat import ChatCompletionRequest
from respd.protocol.conversations import (
    AddItemsRequest,
    CreateConversationRequest,
    UpdateConversationRequest,
)
from respd.protocol.input_tokens import InputTokensRequest
from respd.protocol.responses import CreateResponseRequest

JSON_BODIES: dict[tuple[str, str], type[BaseModel]] = {
    ("post", "/v1/responses"): CreateResponseRequest,
    ("post", "/v1/responses/input_tokens"): InputTokensRequest,
    ("post", "/v1/chat/completions"): ChatCompletionRequest,
    ("post", "/v1/conversations"): CreateConversationRequest,
    ("post", "/v1/conversations/{conversation_id}"): UpdateConversationRequest,
    ("post", "/v1/conversations/{conversation_id}/items"): AddItemsRequest,
}
# Answered as server-sent events when asked to stream.
STREAMING = {
    ("post", "/v1/responses"),
    ("post", "/v1/chat/completions"),
    ("get", "/v1/responses/{response_id}"),
}
UPLOAD = {
    "type": "object",
    "required": ["file", "purpose"],
    "properties": {
        "file": {"type": "string", "format": "binary"},
        "purpose": {"type": "string"},
        "expires_after[anchor]": {"type": "string"},
        "expires_after[seconds]": {"type": "string"},
    },
}
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
ERRORS = {
    "400": "Invalid request",
    "401": "Missing or incorrect API key",
    "403": "Request from an untrusted web origin",
    "404": "No such object (or not the caller's)",
    "413": "Body too large",
    "415": "Body is not JSON (or not multipart on uploads)",
    "429": "A per-key limit is reached",
    "500": "Server error",
    "503": "Busy or shutting down",
}


def _openapi(app: FastAPI) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schemas: dict[str, Any] = doc.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    refs, defs = models_json_schema(
        [(model, "validation") for model in JSON_BODIES.values()],
        ref_template="#/components/schemas/{model}",
    )
    schemas.update(defs.get("$defs", {}))
    schemas["Error"] = ERROR
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, operations in doc.get("paths", {}).items():
        for method, op in operations.items():
            model = JSON_BODIES.get((method, path))
            if model is not None:
                op["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": refs[(model, "validation")]}},
                }
            elif (method, path) == ("post", "/v1/files"):
                op["requestBody"] = {
                    "required": True,
                    "content": {"multipart/form-data": {"schema": UPLOAD}},
                }
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            if (method, path) in STREAMING:
                ok = responses.setdefault("200", {"description": "Successful Response"})
                ok.setdefault("content", {})["text/event-stream"] = {"schema": {"type": "string"}}
            for status, description in ERRORS.items():
                responses[status] = {"description": description, "content": error}
    return doc


def describe(app: FastAPI) -> None:
    """Serve the document above at `/openapi.json` (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
