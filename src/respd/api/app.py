"""The FastAPI application factory: routes, error handling, and the services they call."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from respd import __version__
from respd.api import chat, conversations, files, responses, websocket
from respd.api import models as model_routes
from respd.api.errors import RequestIdMiddleware, install_error_handlers
from respd.api.guard import GuardSettings, RequestGuard
from respd.api.identity import AuthMiddleware, KeyRing
from respd.api.metrics import install_metrics
from respd.api.openapi import describe
from respd.api.quotas import (
    EXPOSED_HEADERS,
    KeyQuotas,
    QuotaMiddleware,
    QuotaSettings,
    TokenAccounting,
)
from respd.engines.base import Engine
from respd.protocol.wire import build_sdk_types
from respd.service.chat.service import ChatService
from respd.service.conversations import ConversationsService
from respd.service.files import DEFAULT_MAX_FILE_BYTES, FilesService
from respd.service.generation.core import ActiveRuns
from respd.service.limits import InputLimits
from respd.service.media.resolver import MediaSettings
from respd.service.models import ModelRegistry
from respd.service.responses.background import BackgroundJobs
from respd.service.responses.service import ResponsesService
from respd.service.responses.stored import StoredResponses
from respd.service.sealing import Sealer
from respd.store import MemoryStore, Store
from respd.store.base import DEFAULT_JOB_LEASE_SECS, DEFAULT_PURGE_INTERVAL_SECS
from respd.store.retention import purge_periodically


def create_app(
    models: ModelRegistry | Engine,
    store: Store | None = None,
    *,
    default_max_tokens: int | None = None,
    sse_keepalive: float = 15.0,
    media: MediaSettings | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    job_lease_secs: float = DEFAULT_JOB_LEASE_SECS,
    purge_interval_secs: float = DEFAULT_PURGE_INTERVAL_SECS,
    metrics_api_key: str | None = None,
    keys: KeyRing | None = None,
    guard: GuardSettings | None = None,
    input_limits: InputLimits | None = None,
    quotas: QuotaSettings | None = None,
    sealer: Sealer | None = None,
) -> FastAPI:
    """Build the app over the models it serves (one engine, or a registry of several). The
    store is owned by the app from here on: closed at shutdown."""
    if not isinstance(models, ModelRegistry):
        models = ModelRegistry([models])
    store = store if store is not None else MemoryStore()
    runs = ActiveRuns()
    service = ResponsesService(
        models,
        store,
        media,
        default_max_tokens=default_max_tokens,
        runs=runs,
        limits=input_limits,
        sealer=sealer,
    )
    jobs = BackgroundJobs(service, store, lease_secs=job_lease_secs)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        build_sdk_types()
        await store.open()
        await jobs.open()
        purge = asyncio.create_task(purge_periodically(store, purge_interval_secs))
        try:
            yield
        finally:
            purge.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await purge
            await jobs.shutdown()
            await store.close()

    app = FastAPI(title="respd", version=__version__, lifespan=lifespan)
    app.state.models = models
    app.state.started_at = int(time.time())
    app.state.sse_keepalive = sse_keepalive
    app.state.responses = service
    app.state.background = jobs
    app.state.stored = StoredResponses(store, jobs)
    app.state.conversations = ConversationsService(
        store, service.media, input_limits, service.sealer
    )
    app.state.files = FilesService(store, max_file_bytes, service.media.cache)
    app.state.media_cache = service.media.cache
    app.state.chat = ChatService(
        models, service.media, default_max_tokens=default_max_tokens, runs=runs, limits=input_limits
    )
    app.state.quotas = KeyQuotas(quotas or QuotaSettings())
    app.state.runs = runs
    install_error_handlers(app)
    describe(app)
    app.include_router(responses.router)
    app.include_router(websocket.router)
    app.include_router(conversations.router)
    app.include_router(files.router)
    app.include_router(chat.router)
    app.include_router(model_routes.router)
    # The last added runs first: request id, then the guard, CORS, and who is asking.
    if quotas is not None and quotas.any:
        app.add_middleware(QuotaMiddleware, quotas=app.state.quotas)
    app.add_middleware(AuthMiddleware, keys=keys or KeyRing())
    if guard is not None and guard.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(guard.cors_origins),
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=EXPOSED_HEADERS,
        )
    if guard is not None:
        app.add_middleware(RequestGuard, settings=guard)
    app.add_middleware(RequestIdMiddleware)
    install_metrics(app, models, store, runs, metrics_api_key, service.media.cache)
    if quotas is not None and quotas.tokens_per_minute:
        runs.observer = TokenAccounting(app.state.quotas, then=runs.observer)
    return app
