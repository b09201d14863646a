"""`/v1/models` and `/health`."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from respd.api.identity import require_operator
from respd.engines.base import Engine
from respd.engines.embedding import Embedder
from respd.engines.routing import RoutedEngine
from respd.protocol.errors import NotFound
from respd.service.codex import codex_catalog
from respd.service.embeddings import EmbeddingModels
from respd.service.media.cache import MediaCache
from respd.service.models import ModelRegistry, ModelState

router = APIRouter()


def _models(request: Request) -> ModelRegistry:
    models: ModelRegistry = request.app.state.models
    return models


def _card(request: Request, model_id: str, window: int | None, **more: Any) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": request.app.state.started_at,
        "owned_by": "respd",
        "context_window": window,
        **more,
    }


def _state_card(request: Request, state: ModelState) -> dict[str, Any]:
    """A model's card; a local model's says whether it is loaded (and why it failed to)."""
    local = state.local
    if local is None:
        assert state.engine is not None
        return _model_card(request, state.engine)
    more: dict[str, Any] = {
        "loaded": state.engine is not None,
        "pinned": local.pin,
        "loads": state.loads,
        "load_error": state.error,
    }
    if state.engine is not None:
        return _model_card(request, state.engine, **more)
    window = local.context_window
    return _card(
        request,
        local.model_id,
        window,
        max_output_tokens=request.app.state.runs.output.cap(window) if window else None,
        input_modalities=["text", "image"] if local.vision else ["text"],
        server_tools=request.app.state.toolbox.tool_types(),
        **more,
    )


def _model_card(request: Request, engine: Engine, **more: Any) -> dict[str, Any]:
    routed: dict[str, Any] = {}
    if isinstance(engine, RoutedEngine):  # one public id over several upstreams
        routed["providers"] = engine.provider_names()
    return _card(
        request,
        engine.model_id,
        engine.context_window,
        # The output cap of a request that sets none (null: the context window alone).
        max_output_tokens=request.app.state.runs.output.cap(engine.context_window),
        input_modalities=["text", "image"] if engine.vision else ["text"],
        # the hosted tool types this server runs for the model (web search: with a backend)
        server_tools=request.app.state.toolbox.tool_types(),
        **routed,
        **more,
    )


def _embedding_card(request: Request, embedder: Embedder) -> dict[str, Any]:
    """A model that only embeds: `/v1/embeddings` takes it, generation does not."""
    return _card(
        request,
        embedder.model_id,
        embedder.max_tokens,
        input_modalities=["text"],
        endpoints=["/v1/embeddings"],
    )


def _etag_matches(header: str | None, etag: str) -> bool:
    """RFC 9110's weak comparison of `If-None-Match` (a list, or `*`) with `etag`."""
    if not header:
        return False
    tags = [t.strip() for t in header.split(",")]
    return "*" in tags or etag in (t.removeprefix("W/") for t in tags)


def _codex_models(request: Request) -> Response:
    """Codex's model discovery: its `ModelsResponse`, with an ETag so an unchanged catalog
    is a 304."""
    body = json.dumps(codex_catalog(_models(request)), separators=(",", ":")).encode()
    etag = f'"{hashlib.sha256(body).hexdigest()[:32]}"'
    headers = {"etag": etag, "cache-control": "no-cache"}
    if _etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


@router.get("/v1/models", response_model=None)
@router.get("/models", include_in_schema=False, response_model=None)
async def list_models(request: Request) -> dict[str, Any] | Response:
    """OpenAI's model list; Codex, which names its `client_version`, gets its own catalog."""
    if "client_version" in request.query_params:
        return _codex_models(request)
    cards = [_state_card(request, state) for state in _models(request).states()]
    chat_ids = {card["id"] for card in cards}
    for embedder in request.app.state.embeddings:
        if embedder.model_id not in chat_ids:
            cards.append(_embedding_card(request, embedder))
    return {"object": "list", "data": cards}


@router.get("/v1/models/{model_id:path}")
@router.get("/models/{model_id:path}", include_in_schema=False)
async def get_model(request: Request, model_id: str) -> dict[str, Any]:
    models = _models(request)
    try:
        resolved = models.resolve(model_id)
        return next(_state_card(request, s) for s in models.states() if s.model_id == resolved)
    except NotFound:  # an embedding model, or the same 404
        embeddings: EmbeddingModels = request.app.state.embeddings
        return _embedding_card(request, embeddings.get(model_id))


@router.post("/v1/models/{model_id:path}/load")
async def load_model(request: Request, model_id: str) -> dict[str, Any]:
    """Load a local model now (operators' route); its card once loaded."""
    require_operator(request)
    models = _models(request)
    await models.ready(model_id)
    return await get_model(request, models.resolve(model_id))


@router.post("/v1/models/{model_id:path}/unload")
async def unload_model(request: Request, model_id: str) -> dict[str, Any]:
    """Unload a local model now (operators' route; a 409 while it runs requests)."""
    require_operator(request)
    models = _models(request)
    unloaded = await models.unload(model_id)
    return {"id": models.resolve(model_id), "object": "model", "unloaded": unloaded}


@router.get("/health")
@router.get("/v1/health", include_in_schema=False)
async def health(request: Request) -> JSONResponse:
    """200 while every engine can serve; 503 (same body) when one cannot, e.g. its worker
    died, so a load balancer takes the replica out."""
    engines = list(_models(request))
    for engine in engines:
        probe = getattr(engine, "probe", None)  # a remote engine checks it can be reached
        if probe is not None:
            await probe()
    stats = {e.model_id: e.stats() for e in engines}
    gate = request.app.state.runs.gate  # requests waiting for a slot wait there
    if gate is not None:
        stats = {
            m: replace(
                s, queued=s.queued + gate.queued(m), cancelled=s.cancelled + gate.cancelled(m)
            )
            for m, s in stats.items()
        }
    healthy = all(s.healthy for s in stats.values())
    first = _models(request).default_id()  # a local model not loaded has no stats yet
    body: dict[str, Any] = {
        "status": "ok" if healthy else "unhealthy",
        "model": first,
        "engine": stats[first].as_dict() if first in stats else None,
        "engines": {model: s.as_dict() for model, s in stats.items()},
    }
    cache: MediaCache | None = getattr(request.app.state, "media_cache", None)
    if cache is not None:  # input media kept by source: hits, misses, bytes, entries
        body["media_cache"] = asdict(cache.stats())
    return JSONResponse(body, status_code=200 if healthy else 503)
