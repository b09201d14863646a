"""`/v1/models` and `/health`."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from respd.engines.base import Engine
from respd.service.media.cache import MediaCache
from respd.service.models import ModelRegistry

router = APIRouter()


def _models(request: Request) -> ModelRegistry:
    models: ModelRegistry = request.app.state.models
    return models


def _model_card(request: Request, engine: Engine) -> dict[str, Any]:
    return {
        "id": engine.model_id,
        "object": "model",
        "created": request.app.state.started_at,
        "owned_by": "respd",
        "context_window": engine.context_window,
        # The output cap of a request that sets none (null: the context window alone).
        "max_output_tokens": request.app.state.runs.output.cap(engine.context_window),
        "input_modalities": ["text", "image"] if engine.vision else ["text"],
    }


@router.get("/v1/models")
@router.get("/models", include_in_schema=False)
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(request, e) for e in _models(request)]}


@router.get("/v1/models/{model_id:path}")
@router.get("/models/{model_id:path}", include_in_schema=False)
async def get_model(request: Request, model_id: str) -> dict[str, Any]:
    return _model_card(request, _models(request).get(model_id))


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
    healthy = all(s.healthy for s in stats.values())
    first = engines[0]
    body: dict[str, Any] = {
        "status": "ok" if healthy else "unhealthy",
        "model": first.model_id,
        "engine": stats[first.model_id].as_dict(),
        "engines": {model: s.as_dict() for model, s in stats.items()},
    }
    cache: MediaCache | None = getattr(request.app.state, "media_cache", None)
    if cache is not None:  # input media kept by source: hits, misses, bytes, entries
        body["media_cache"] = asdict(cache.stats())
    return JSONResponse(body, status_code=200 if healthy else 503)
