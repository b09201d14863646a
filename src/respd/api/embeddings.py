"""`/v1/embeddings` route."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from respd.api.body import parse_body
from respd.api.streaming import until_disconnect
from respd.protocol.embeddings import EmbeddingRequest
from respd.service.embeddings import EmbeddingModels, create_embeddings

router = APIRouter()


@router.post("/v1/embeddings")
@router.post("/embeddings", include_in_schema=False)
async def embeddings(request: Request) -> dict[str, Any]:
    models: EmbeddingModels = request.app.state.embeddings
    body = await parse_body(request, EmbeddingRequest)
    answer = await until_disconnect(request, create_embeddings(models, body))
    request.app.state.metrics.embedded_tokens.labels(body.model).inc(
        answer["usage"]["prompt_tokens"]
    )
    return answer
