"""`GET /v1/providers`: the routing table of models served by several providers — each
provider's health, circuit, measured latency and throughput — for operators (behind the
`/metrics` key when one is set, else an API key); and the `x-respd-provider` header of a
routed answer."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from respd.api.identity import require_operator
from respd.engines.routing import Provider, RoutedEngine
from respd.service.models import ModelRegistry

router = APIRouter()

PROVIDER_HEADER = "x-respd-provider"


def provider_headers(body: dict[str, Any]) -> dict[str, str]:
    """The header naming the provider that answered (and those that failed before it),
    from a response or completion's `provider` field."""
    routed = body.get("provider")
    if not isinstance(routed, dict) or not routed.get("name"):
        return {}
    failed = [f["name"] for f in routed.get("failed") or [] if isinstance(f, dict)]
    value = routed["name"] + (f"; failed={','.join(failed)}" if failed else "")
    return {PROVIDER_HEADER: value}


def provider_row(model_id: str, provider: Provider) -> dict[str, Any]:
    stats = provider.stats
    engine = provider.engine.stats()
    return {
        "model": model_id,
        "provider": provider.name,
        "endpoint": provider.endpoint,
        "healthy": engine.healthy,
        "problem": engine.problem,
        "circuit": provider.breaker.state,
        "consecutive_failures": provider.breaker.consecutive,
        "running": engine.running,
        "concurrency": getattr(provider.engine, "max_concurrency", None),
        "requests": stats.requests,
        "succeeded": stats.succeeded,
        "failed": stats.failed,
        "fallbacks": stats.fallbacks,
        "latency_ms": None if stats.latency is None else round(stats.latency * 1000, 1),
        "throughput_tps": None if stats.throughput is None else round(stats.throughput, 1),
        "price_prompt": provider.price_prompt,
        "price_completion": provider.price_completion,
        "last_error": stats.last_error,
    }


def routing_table(models: ModelRegistry) -> list[dict[str, Any]]:
    return [
        provider_row(engine.model_id, provider)
        for engine in models
        if isinstance(engine, RoutedEngine)
        for provider in engine.providers
    ]


@router.get("/v1/providers")
async def list_providers(request: Request) -> dict[str, Any]:
    """Every routed model's providers, in their configured order. Operators' data: with
    `--metrics-api-key` set only that key reads it, else any API key the server takes."""
    require_operator(request)
    return {"object": "list", "data": routing_table(request.app.state.models)}
