"""`GET /metrics`: Prometheus text exposition of requests, tokens, latencies, the engines'
slots, queues and image work, the media cache, and what the store holds.

Each app has its own `CollectorRegistry` (tests build many apps in one process). Requests
are counted by a pure ASGI middleware (a `BaseHTTPMiddleware` would buffer streams) under
their route template, so label values stay bounded whatever paths clients send.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, Mapping

from fastapi import APIRouter, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from respd.api.identity import require_metrics_key
from respd.api.routes import add_routes
from respd.engines.base import Detail, Engine, detail_of
from respd.engines.routing import RoutedEngine
from respd.service.generation.core import ActiveRuns, Api
from respd.service.generation.output import Usage
from respd.service.media.cache import MediaCache
from respd.service.models import ModelRegistry
from respd.service.tools.hosted.plan import HostedToolbox
from respd.store import Store

log = logging.getLogger(__name__)

OTHER_ROUTE = "other"
# From a short reply on a small model to a long one on a loaded CPU.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
STORE_KINDS = ("responses", "conversations", "files")

router = APIRouter()


def _slots(engine: Engine) -> int | None:
    """How many generations the engine runs at once, where it says (`EngineStats` only
    counts the busy ones)."""
    for name in ("parallel", "capacity"):
        value = getattr(engine, name, None)
        if isinstance(value, int):
            return value
    return None


class EngineCollector(Collector):
    """The engines' slots and queues, and each engine's own counters (`EngineStats.details`,
    exported as `engines.base.detail_of` names them), read at scrape time."""

    def __init__(self, models: ModelRegistry, runs: ActiveRuns | None = None) -> None:
        self.models = models
        self.runs = runs  # its admission gate holds the requests waiting for a slot

    def collect(self) -> Iterator[Metric]:
        queued = GaugeMetricFamily(
            "respd_queue_depth", "Requests admitted and waiting for a slot.", labels=["model"]
        )
        active = GaugeMetricFamily(
            "respd_slots_active", "Slots generating right now.", labels=["model"]
        )
        total = GaugeMetricFamily(
            "respd_slots_total", "Generations the engine can run at once.", labels=["model"]
        )
        details: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for engine in self.models:
            stats = engine.stats()
            gate = self.runs.gate if self.runs is not None else None
            waiting = gate.queued(engine.model_id) if gate is not None else 0
            queued.add_metric([engine.model_id], stats.queued + waiting)
            active.add_metric([engine.model_id], stats.running)
            slots = _slots(engine)
            if slots is not None:
                total.add_metric([engine.model_id], slots)
            for key, value in stats.all_details().items():
                detail = detail_of(key)
                family = details.get(detail.metric)
                if family is None:
                    family = details[detail.metric] = _family(detail)
                family.add_metric([engine.model_id, *(v for _, v in detail.labels)], value)
        yield from (queued, active, total)
        yield from details.values()


def _family(detail: Detail) -> CounterMetricFamily | GaugeMetricFamily:
    kind = GaugeMetricFamily if detail.gauge else CounterMetricFamily
    return kind(detail.metric, detail.help, labels=["model", *(k for k, _ in detail.labels)])


class MediaCacheCollector(Collector):
    """The media cache's hits, misses and size, read at scrape time."""

    def __init__(self, cache: MediaCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        stats = self.cache.stats()
        yield CounterMetricFamily(
            "respd_media_cache_hits",
            "Input images and documents taken from the media cache.",
            value=stats.hits,
        )
        yield CounterMetricFamily(
            "respd_media_cache_misses",
            "Input images and documents not in the media cache (fetched, decoded, checked).",
            value=stats.misses,
        )
        yield GaugeMetricFamily(
            "respd_media_cache_bytes", "Bytes the media cache holds.", value=stats.bytes
        )
        yield GaugeMetricFamily(
            "respd_media_cache_entries", "Entries the media cache holds.", value=stats.entries
        )


class ProviderCollector(Collector):
    """Each routed model's providers: requests, failures, fallbacks, time to first output
    and circuit state. Read from the registry at each scrape (upstreams may be re-read)."""

    def __init__(self, models: ModelRegistry) -> None:
        self.models = models

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "provider"]
        requests = CounterMetricFamily(
            "respd_provider_requests",
            "Requests sent to a routed model's provider, by outcome (succeeded, failed).",
            labels=[*labels, "outcome"],
        )
        fallbacks = CounterMetricFamily(
            "respd_provider_fallbacks",
            "Failures of a provider after which the next provider was tried.",
            labels=labels,
        )
        latency = SummaryMetricFamily(
            "respd_provider_first_output_seconds",
            "Seconds from sending a request to a provider to its first output.",
            labels=labels,
        )
        circuit = GaugeMetricFamily(
            "respd_provider_circuit_open",
            "1 while a provider's circuit is open or half open (skipped or probed), else 0.",
            labels=labels,
        )
        for engine in self.models:
            if not isinstance(engine, RoutedEngine):
                continue
            for p in engine.providers:
                key = [engine.model_id, p.name]
                requests.add_metric([*key, "succeeded"], p.stats.succeeded)
                requests.add_metric([*key, "failed"], p.stats.failed)
                fallbacks.add_metric(key, p.stats.fallbacks)
                latency.add_metric(key, p.stats.latency_count, p.stats.latency_sum)
                circuit.add_metric(key, 0 if p.breaker.state == "closed" else 1)
        yield from (requests, fallbacks, latency, circuit)


class LoopCollector(Collector):
    """Turns the repetition stop ended (their output looped) and turns the context window
    ended, read at scrape time."""

    def __init__(self, runs: ActiveRuns) -> None:
        self.runs = runs

    def collect(self) -> Iterator[Metric]:
        yield _per_api(
            "respd_repetition_stops",
            "Turns ended as incomplete because their output repeated one span again and again.",
            self.runs.looped,
        )
        yield _per_api(
            "respd_context_end_stops",
            "Turns ended as incomplete because they filled the context window.",
            self.runs.context_ends,
        )


class ServerToolCollector(Collector):
    """Calls of the tools the server runs for the model, by tool and outcome."""

    def __init__(self, toolbox: HostedToolbox) -> None:
        self.toolbox = toolbox

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "respd_server_tool_calls",
            "Calls of tools the server runs itself (mcp, mcp_list_tools, file_search, "
            "web_search), by outcome (completed, failed).",
            labels=["type", "outcome"],
        )
        for (tool, outcome), count in sorted(self.toolbox.calls.items()):
            family.add_metric([tool, outcome], count)
        yield family


def _per_api(name: str, documentation: str, counts: Mapping[Api, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=["api"])
    for api, count in counts.items():
        family.add_metric([api], count)
    return family


class Metrics:
    """The app's registry and instruments; also the generation core's observer."""

    def __init__(
        self,
        models: ModelRegistry,
        store: Store,
        media_cache: MediaCache | None = None,
        runs: ActiveRuns | None = None,
    ) -> None:
        self.store = store
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "respd_requests",
            "HTTP requests answered, by route template, method and status.",
            ["route", "method", "status"],
            registry=r,
        )
        self.input_tokens = Counter(
            "respd_input_tokens", "Prompt tokens of finished generations.", ["api"], registry=r
        )
        self.output_tokens = Counter(
            "respd_output_tokens", "Tokens generated.", ["api"], registry=r
        )
        self.cached_tokens = Counter(
            "respd_cached_tokens", "Prompt tokens served from the KV cache.", ["api"], registry=r
        )
        self.ttft = Histogram(
            "respd_time_to_first_token_seconds",
            "From admission (queueing included) to the first generated output.",
            ["api"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.generation = Histogram(
            "respd_generation_seconds",
            "From admission to the end of a generation, whatever its outcome.",
            ["api"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.embedded_tokens = Counter(
            "respd_embedding_input_tokens",
            "Input tokens turned into vectors by /v1/embeddings, by model.",
            ["model"],
            registry=r,
        )
        self.stored = Gauge(
            "respd_store_records", "Records the store holds, by kind.", ["kind"], registry=r
        )
        r.register(EngineCollector(models, runs))
        if media_cache is not None:
            r.register(MediaCacheCollector(media_cache))

    # -- GenerationObserver ---------------------------------------------------------------

    def first_token(self, api: Api, seconds: float) -> None:
        self.ttft.labels(api).observe(seconds)

    def finished(self, api: Api, usage: Usage, seconds: float) -> None:
        self.input_tokens.labels(api).inc(usage.input_tokens)
        self.output_tokens.labels(api).inc(usage.output_tokens)
        self.cached_tokens.labels(api).inc(usage.cached_tokens)
        self.generation.labels(api).observe(seconds)

    # -- scraping -------------------------------------------------------------------------

    async def exposition(self) -> bytes:
        try:
            stats = await self.store.stats()
        except Exception:  # a store that cannot answer must not hide every other number
            log.exception("reading the store's sizes for /metrics failed")
        else:
            for kind in STORE_KINDS:
                self.stored.labels(kind).set(stats.get(kind, 0))
        return generate_latest(self.registry)


def _leaf_routes(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    for route in routes:
        # Recent FastAPI keeps an included router whole (its `original_router`); older
        # versions copy its routes in.
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _leaf_routes(inner.routes)
        else:
            yield route


def route_template(routes: Iterable[BaseRoute], scope: Scope) -> str:
    """The template of the route `scope` is for (`/v1/responses/{response_id}`), also when
    only its method is wrong; any other path is `other`. Routing leaves its route in the
    scope; a request refused before routing (a missing key, a body too large) is matched
    here."""
    routed = scope.get("route")
    if routed is not None:
        return str(getattr(routed, "path", OTHER_ROUTE))
    partial = None
    for route in _leaf_routes(routes):
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return str(getattr(route, "path", OTHER_ROUTE))
        if match == Match.PARTIAL and partial is None:
            partial = str(getattr(route, "path", OTHER_ROUTE))
    return partial or OTHER_ROUTE


class MetricsMiddleware:
    """Counts each HTTP request once, when its response starts (a stream is counted
    before its body), or when it ends without one."""

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: list[BaseRoute]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        counted = False

        def count(status: str) -> None:
            nonlocal counted
            if not counted:
                counted = True
                route = route_template(self.routes, scope)
                self.metrics.requests.labels(route, scope["method"], status).inc()

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                count(str(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        except asyncio.CancelledError:
            count("499")  # the client went away before an answer
            raise
        finally:
            count("500")


@router.get("/metrics", include_in_schema=False)
async def scrape(request: Request) -> Response:
    require_metrics_key(request)
    body = await request.app.state.metrics.exposition()
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def install_metrics(
    app: FastAPI,
    models: ModelRegistry,
    store: Store,
    runs: ActiveRuns,
    api_key: str | None,
    media_cache: MediaCache | None = None,
    toolbox: HostedToolbox | None = None,
) -> Metrics:
    """Serve `/metrics` (behind `api_key` when one is given), count every request, and
    observe every generation. Call it after the other middlewares: it wraps them all, so
    requests they refuse are counted too."""
    metrics = Metrics(models, store, media_cache, runs)
    runs.observer = metrics
    metrics.registry.register(LoopCollector(runs))
    metrics.registry.register(ProviderCollector(models))
    if toolbox is not None:
        metrics.registry.register(ServerToolCollector(toolbox))
    app.state.metrics = metrics
    app.state.metrics_api_key = api_key or None
    add_routes(app, router)
    app.add_middleware(MetricsMiddleware, metrics=metrics, routes=app.router.routes)
    return metrics
