"""`/v1/models` and `/health`."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request

from respd.protocol.errors import model_not_found

router = APIRouter()


def _model_card(request: Request) -> dict[str, Any]:
    state = request.app.state
    return {
        "id": state.engine.model_id,
        "object": "model",
        "created": state.started_at,
        "owned_by": "respd",
        "context_window": state.engine.context_window,
        "input_modalities": ["text", "image"] if state.engine.vision else ["text"],
    }


@router.get("/v1/models")
@router.get("/models", include_in_schema=False)
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(request)]}


@router.get("/v1/models/{model_id:path}")
@router.get("/models/{model_id:path}", include_in_schema=False)
async def get_model(request: Request, model_id: str) -> dict[str, Any]:
    card = _model_card(request)
    if model_id != card["id"]:
        raise model_not_found(model_id)
    return card


@router.get("/health")
@router.get("/v1/health", include_in_schema=False)
async def health(request: Request) -> dict[str, Any]:
    engine = request.app.state.engine
    return {"status": "ok", "model": engine.model_id, "engine": asdict(engine.stats())}
