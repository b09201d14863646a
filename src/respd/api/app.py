"""The FastAPI application factory: routes, error handling, and the services they call."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from respd import __version__
from respd.api import chat, conversations, embeddings, files, playground, responses, websocket
from respd.api import models as model_routes
from respd.api import providers as provider_routes
from respd.api import vector_stores as vector_store_routes
from respd.api.errors import RequestIdMiddleware, install_error_handlers
from respd.api.guard import GuardSettings, RequestGuard
from respd.api.identity import AuthMiddleware, KeyRing
from respd.api.metrics import install_metrics
from respd.api.openapi import describe
from respd.api.quotas import (
    EXPOSED_HEADERS,
    ConnectionLimits,
    KeyQuotas,
    QuotaMiddleware,
    QuotaSettings,
    TokenAccounting,
)
from respd.api.routes import add_routes
from respd.engines.base import Engine
from respd.engines.embedding import Embedder
from respd.protocol.wire import build_sdk_types
from respd.service.chat.service import ChatService
from respd.service.conversations import ConversationsService
from respd.service.embeddings import EmbeddingModels
from respd.service.files import DEFAULT_MAX_FILE_BYTES, FilesService
from respd.service.generation.admission import AdmissionGate
from respd.service.generation.core import ActiveRuns
from respd.service.generation.policy import OutputPolicy
from respd.service.limits import InputLimits
from respd.service.media.resolver import MediaResolver, MediaSettings
from respd.service.models import ModelRegistry
from respd.service.responses.http_steering import SteerableStreams
from respd.service.responses.service import ResponsesService
from respd.service.responses.socket_limits import SocketLimits
from respd.service.sealing import Sealer
from respd.service.shared import Shared
from respd.service.tools.hosted.plan import HostedToolbox
from respd.service.tools.hosted.settings import HostedToolSettings
from respd.service.vector_stores.service import VectorStores
from respd.store import MemoryStore, Store
from respd.store.base import DEFAULT_JOB_LEASE_SECS, DEFAULT_PURGE_INTERVAL_SECS
from respd.store.retention import purge_periodically


@dataclass
class Services:
    """What the routes call, over collaborators built once and shared: the store, the
    media resolver (and its cache), the sealer, the running generations."""

    responses: ResponsesService
    conversations: ConversationsService
    files: FilesService
    chat: ChatService
    media: MediaResolver
    runs: ActiveRuns
    toolbox: HostedToolbox


def build_services(
    models: ModelRegistry,
    store: Store,
    *,
    output: OutputPolicy | None,
    media: MediaSettings | None,
    max_file_bytes: int,
    job_lease_secs: float,
    input_limits: InputLimits | None,
    sealer: Sealer | None,
    quotas: KeyQuotas | None = None,
    vector_stores: VectorStores | None = None,
    hosted_tools: HostedToolSettings | None = None,
) -> Services:
    resolver = MediaResolver(store, media)
    toolbox = HostedToolbox.from_settings(hosted_tools or HostedToolSettings(), vector_stores)
    shared = Shared(
        models,
        store,
        resolver,
        sealer or Sealer.random(),
        runs=ActiveRuns(output=output),
        limits=input_limits or InputLimits(),
        quotas=quotas or KeyQuotas(QuotaSettings()),
        vector_stores=vector_stores,
        toolbox=toolbox,
    )
    return Services(
        responses=ResponsesService(shared, lease_secs=job_lease_secs),
        conversations=ConversationsService(shared),
        files=FilesService(store, max_file_bytes, resolver.cache, shared.quotas),
        chat=ChatService(shared),
        media=resolver,
        runs=shared.runs,
        toolbox=toolbox,
    )


def _lifespan(
    store: Store,
    responses: ResponsesService,
    purge_interval_secs: float,
    vector_stores: VectorStores | None = None,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Open the store and the background jobs; purge expired state while serving; stop the
    jobs, then close the store."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        build_sdk_types()
        await store.open()
        await responses.open()
        if vector_stores is not None:
            await vector_stores.open()
        purge = asyncio.create_task(purge_periodically(store, purge_interval_secs))
        try:
            yield
        finally:
            purge.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await purge
            if vector_stores is not None:
                await vector_stores.close()
            await responses.shutdown()
            await store.close()

    return lifespan


def _install_routes(app: FastAPI, ui: bool) -> None:
    install_error_handlers(app)
    describe(app)
    for module in (responses, websocket, conversations, files, chat, embeddings, model_routes):
        add_routes(app, module.router)
    add_routes(app, vector_store_routes.router)
    add_routes(app, provider_routes.router)
    if ui:
        add_routes(app, playground.router)


def _install_middleware(
    app: FastAPI,
    keys: KeyRing | None,
    guard: GuardSettings | None,
    quotas: QuotaSettings | None,
) -> None:
    # The last added runs first: request id, then the guard, CORS, and who is asking.
    if quotas is not None and quotas.any:
        app.add_middleware(QuotaMiddleware, quotas=app.state.quotas)
    if quotas is not None and (quotas.sockets_per_key or quotas.sockets_total):
        app.add_middleware(ConnectionLimits, quotas=app.state.quotas)
    app.add_middleware(AuthMiddleware, keys=app.state.keys)
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


def create_app(
    models: ModelRegistry | Engine,
    store: Store | None = None,
    *,
    output: OutputPolicy | None = None,
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
    admission: AdmissionGate | None = None,
    socket_limits: SocketLimits | None = None,
    embedders: Iterable[Embedder] = (),
    file_search_embedder: Embedder | None = None,
    hosted_tools: HostedToolSettings | None = None,
    ui: bool = True,
) -> FastAPI:
    """Build the app over the models it serves (one engine, or a registry of several). The
    store is owned by the app from here on: closed at shutdown. `embedders` answer
    `/v1/embeddings`, each for its model id; `ui` serves the web playground at `/`."""
    if not isinstance(models, ModelRegistry):
        models = ModelRegistry([models])
    store = store if store is not None else MemoryStore()
    key_quotas = KeyQuotas(quotas or QuotaSettings())
    vector_stores = VectorStores(store, file_search_embedder, quotas=key_quotas)
    services = build_services(
        models,
        store,
        output=output,
        media=media,
        max_file_bytes=max_file_bytes,
        job_lease_secs=job_lease_secs,
        input_limits=input_limits,
        sealer=sealer,
        quotas=key_quotas,
        vector_stores=vector_stores,
        hosted_tools=hosted_tools,
    )
    runs = services.runs
    runs.gate = admission
    lifespan = _lifespan(store, services.responses, purge_interval_secs, vector_stores)
    app = FastAPI(title="respd", version=__version__, lifespan=lifespan)
    app.state.models = models
    app.state.embeddings = EmbeddingModels(embedders, input_limits)
    app.state.started_at = int(time.time())
    app.state.sse_keepalive = sse_keepalive
    app.state.responses = services.responses
    app.state.stored = services.responses.stored
    app.state.steerable = SteerableStreams(services.responses)
    app.state.conversations = services.conversations
    app.state.files = services.files
    app.state.vector_stores = vector_stores
    app.state.media_cache = services.media.cache
    app.state.chat = services.chat
    app.state.quotas = key_quotas
    app.state.runs = runs
    app.state.toolbox = services.toolbox
    app.state.socket_limits = socket_limits or SocketLimits()
    app.state.keys = keys or KeyRing()
    _install_routes(app, ui)
    _install_middleware(app, keys, guard, quotas)
    install_metrics(
        app, models, store, runs, metrics_api_key, services.media.cache, services.toolbox
    )
    if quotas is not None and quotas.tokens_per_minute:
        runs.observer = TokenAccounting(app.state.quotas, then=runs.observer)
    return app
