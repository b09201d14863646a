"""`respd serve`: load the model (with progress), build the app, run uvicorn."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import uvicorn
from rich.console import Console

from respd.api.guard import MULTIPART_OVERHEAD, default_allowed_hosts, is_loopback
from respd.api.identity import KeyRing
from respd.config import Settings
from respd.engines.base import Engine
from respd.engines.embedding import Embedder
from respd.engines.llamacpp import LlamaCppEngine, ProjectorError
from respd.engines.routing import RoutedEngine
from respd.engines.upstream import UpstreamEngine, UpstreamSpec
from respd.header_timeout import header_timeout_protocol
from respd.local_models import ModelsError, local_models, several
from respd.logs import uvicorn_log_config
from respd.service.generation.core import ActiveRuns
from respd.service.models import LocalModel, ModelRegistry, PoolLimits
from respd.store import Store, StoreConfigError
from respd.upstreams import Upstreams, UpstreamsError, loop_caller

# The web stack (FastAPI, pydantic models, the openai SDK's types: some 40 MiB) is imported
# only once the model is loaded. llama.cpp clears its whole KV buffer when it creates the
# context, so that moment is the process's peak memory; the engine then hands the unused
# pages back (`engines/llamacpp/pages.py`) before the web stack grows the process.
if TYPE_CHECKING:
    from fastapi import FastAPI

    from respd.api.guard import GuardSettings
    from respd.service.generation.admission import AdmissionGate

log = logging.getLogger(__name__)


CONNECTIONS_GRACE_SECS = 5


class DrainingServer(uvicorn.Server):
    """uvicorn, with a graceful shutdown that knows about generations: on SIGTERM (or
    SIGINT) it stops accepting connections, lets running generations finish for up to
    `grace` seconds, then interrupts the rest (each client still gets its terminal event:
    `response.incomplete`, or Chat's error event) and exits 0."""

    def __init__(
        self,
        config: uvicorn.Config,
        runs: ActiveRuns,
        grace: float,
        on_hangup: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self.runs = runs
        self.grace = grace
        self.on_hangup = on_hangup

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # no new connections while draining
        if len(self.runs):
            log.info("waiting up to %gs for %d generation(s)", self.grace, len(self.runs))
        interrupted = await self.runs.drain(self.grace)
        if interrupted:
            log.warning("interrupted %d generation(s) at shutdown", interrupted)
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn raises a handled SIGTERM again once it has shut down, so the process dies
        # of it (exit 143); a shutdown that completed is a clean exit here.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        if self.on_hangup is not None and hasattr(signal, "SIGHUP"):
            hangup = self.on_hangup
            original[signal.SIGHUP] = signal.signal(signal.SIGHUP, lambda *_: hangup())
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def load_engines(settings: Settings, console: Console) -> tuple[ModelRegistry, Upstreams]:
    """The local model (unless --engine openai) and every upstream, each under its id."""
    engines: list[Engine] = []
    local: list[LocalModel] = []
    upstreams = Upstreams(settings, console.print)
    has_upstreams = settings.upstream or settings.upstreams_file
    if settings.engine == "openai" and not settings.upstream_url and not has_upstreams:
        raise SystemExit(
            "respd: --engine openai needs --upstream-url, --upstream or --upstreams-file"
        )
    try:
        if settings.engine == "openai" and settings.upstream_url:
            main = UpstreamSpec(
                settings.upstream_url,
                alias=settings.model_alias,
                model=settings.upstream_model,
                api_key=settings.upstream_api_key,
                vision=settings.mmproj is not None,
            )
            engines.append(upstreams.engine(main))
        elif settings.engine != "openai" and not several(settings):
            engines.append(load_engine(settings, console))
        elif settings.engine != "openai":
            local = local_models(settings, lambda own: load_engine(own, console))
        engines += upstreams.build(upstreams.specs())
        registry = ModelRegistry(engines, local=local, limits=pool_limits(settings))
    except (UpstreamsError, ModelsError, ValueError) as exc:
        raise SystemExit(f"respd: {exc}") from None
    for model in local:
        if model.pin:  # pinned models are there from the start, and stay
            try:
                registry.preload(model.model_id)
            except Exception as exc:
                raise SystemExit(
                    f"respd: cannot load pinned model {model.model_id}: {exc}"
                ) from None
    if local:
        listed = ", ".join(m.model_id + (" (pinned)" if m.pin else "") for m in local)
        console.print(f"Local models, loaded on first use: {listed}")
    return registry, upstreams


def pool_limits(settings: Settings) -> PoolLimits:
    return PoolLimits(
        max_loaded=settings.models_max,
        memory_bytes=settings.models_memory_mb * 2**20,
        idle_secs=settings.models_idle_secs,
    )


def load_engine(settings: Settings, console: Console) -> LlamaCppEngine:
    try:
        path, mmproj = settings.model_files()
    except Exception as exc:  # an hf:// model that cannot be pulled (a HubError, a network error)
        raise SystemExit(f"respd: cannot get the model: {exc}") from None
    if not path.is_file():
        raise SystemExit(f"respd: model file not found: {path}")
    if mmproj is not None and not mmproj.is_file():
        raise SystemExit(f"respd: projector file not found: {mmproj}")
    template = settings.chat_template.read_text() if settings.chat_template else None
    kv_dir = settings.kv_cache_dir.expanduser() if settings.kv_cache_dir else None
    size_mb = path.stat().st_size / 2**20
    started = time.monotonic()
    with console.status(f"[bold]Loading[/] {path.name} ({size_mb:.0f} MiB)…", spinner="dots"):
        try:
            engine = LlamaCppEngine(
                path,
                model_id=settings.resolved_alias(),
                n_ctx=settings.ctx_size,
                n_threads=settings.threads,
                n_batch=settings.batch_size,
                parallel=settings.parallel,
                max_queue=settings.max_queue,
                chat_template=template,
                repack=settings.repack_weights(),
                mmproj=mmproj,
                sampling=settings.sampling_overrides(embedded_model=not settings.model),
                dry_sequence_breakers=settings.dry_breakers(),
                speculation=settings.speculation_settings(),
                jump_forward=settings.jump_forward,
                kv_cache_ram_bytes=settings.kv_cache_ram_mb * 2**20,
                kv_cache_dir=kv_dir,
                kv_cache_disk_bytes=settings.kv_cache_disk_mb * 2**20,
                image_encode=settings.image_encode,
                image_threads=settings.image_threads,
            )
        except ProjectorError as exc:
            raise SystemExit(
                f"respd: cannot use the projector {mmproj} with {path.name}: {exc}"
            ) from None
        except OSError as exc:  # the model file was checked above: this is the cache dir
            raise SystemExit(f"respd: cannot use --kv-cache-dir {kv_dir}: {exc}") from None
    vision = f", vision from {mmproj.name}" if mmproj is not None else ""
    console.print(
        f"Loaded {path.name} in {time.monotonic() - started:.1f}s "
        f"(context {engine.context_window} tokens, {settings.parallel} slots, "
        f"{settings.threads} threads{vision})"
    )
    return engine


def build_store(settings: Settings) -> Store:
    try:
        return settings.open_store()
    except StoreConfigError as exc:
        raise SystemExit(f"respd: {exc}") from exc


def guard_settings(settings: Settings) -> GuardSettings:
    """The request guard's settings: the API layer's own type, so built here, not by the
    settings themselves."""
    from respd.api.guard import GuardSettings

    return GuardSettings(
        allowed_hosts=settings.allowed_hosts or default_allowed_hosts(settings.host),
        cors_origins=settings.cors_origins,
        max_request_bytes=settings.max_request_bytes,
        max_upload_bytes=settings.max_file_bytes + MULTIPART_OVERHEAD,
    )


def admission_gate(settings: Settings, models: ModelRegistry) -> AdmissionGate:
    """The engines' slots, shared fairly between identities: llama.cpp's --parallel
    sequences; an upstream's connections (it queues on its side too)."""
    from respd.service.generation.admission import AdmissionGate

    local = {m.model_id: m.slots or settings.parallel for m in models.local_models()}
    slots = local | remote_slots(settings, models)
    return AdmissionGate(settings.parallel, settings.max_queue, slots)


def remote_slots(settings: Settings, engines: Iterable[Engine]) -> dict[str, int]:
    """An upstream's slots are its connections; a routed model's, its providers'."""
    slots: dict[str, int] = {}
    for engine in engines:
        if isinstance(engine, UpstreamEngine):
            slots[engine.model_id] = engine.max_concurrency
        elif isinstance(engine, RoutedEngine):
            slots[engine.model_id] = sum(
                getattr(p.engine, "max_concurrency", settings.parallel) for p in engine.providers
            )
    return slots


def load_embedders(settings: Settings, models: ModelRegistry) -> list[Embedder]:
    """--embedding-model (checked now), the local chat model's embedder, and every
    upstream (it forwards `/v1/embeddings` for its model id)."""
    if settings.embedding_model is not None:
        path = settings.embedding_model.expanduser()
        if not path.is_file():
            raise SystemExit(f"respd: embedding model file not found: {path}")
    # The loaded chat model's own file: never fetched again, and the right one among several.
    local = next(
        ((e.model_path, e.model_id) for e in models if isinstance(e, LlamaCppEngine)), None
    )
    upstreams: list[Embedder] = [e for e in models if isinstance(e, UpstreamEngine)]
    embedders = [*settings.embedders(local), *upstreams]
    ids = [e.model_id for e in embedders]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"respd: two models embed under the same id: {ids}")
    return embedders


def build_app(
    settings: Settings,
    models: ModelRegistry,
    store: Store,
    keys: KeyRing,
    embedders: list[Embedder] | None = None,
) -> FastAPI:
    from respd.api.app import create_app

    return create_app(
        models,
        store,
        output=settings.output_policy(),
        sse_keepalive=settings.sse_keepalive_secs,
        media=settings.media_settings(),
        max_file_bytes=settings.max_file_bytes,
        job_lease_secs=settings.job_lease_secs,
        purge_interval_secs=settings.store_purge_interval_secs,
        metrics_api_key=settings.metrics_api_key,
        keys=keys,
        guard=guard_settings(settings),
        input_limits=settings.input_limits(),
        quotas=settings.quota_settings(),
        sealer=settings.sealer(),
        admission=admission_gate(settings, models),
        socket_limits=settings.socket_limits(),
        embedders=embedders or (),
        file_search_embedder=settings.file_search_embedder(embedders or []),
        hosted_tools=settings.hosted_tools(),
        ui=not settings.no_ui,
    )


def serve(settings: Settings) -> int:
    console = Console(stderr=True)
    store = build_store(settings)  # before the model: a bad --store fails fast
    try:
        keys = KeyRing(settings.api_key, settings.api_keys_file)
    except OSError as exc:
        raise SystemExit(f"respd: cannot read the API keys file: {exc}") from exc
    if not keys.enabled and not is_loopback(settings.host):
        log.warning(
            "no API keys are configured and respd listens on %s: anyone who can reach it "
            "can read and delete everything stored; set --api-key or --api-keys-file",
            settings.host,
        )
    models, upstreams = load_engines(settings, console)
    app = build_app(settings, models, store, keys, load_embedders(settings, models))
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=uvicorn_log_config(settings.log_settings()),
        # Generations were drained already (`DrainingServer`); this bounds the rest.
        timeout_graceful_shutdown=CONNECTIONS_GRACE_SECS,
        # uvicorn's protocol, closing connections that stall in a request head or body.
        http=header_timeout_protocol(
            settings.header_timeout_secs,
            settings.http_parser,
            body_seconds=settings.body_timeout_secs,
            min_body_rate=settings.min_upload_rate,
        ),
        loop=settings.event_loop,
    )
    gate = app.state.runs.gate

    def reread(engines: list[Engine]) -> None:
        if gate is not None:
            gate.per_engine.update(remote_slots(settings, engines))

    def hangup() -> None:
        """SIGHUP: the keys file and the upstreams file are read again."""
        keys.reload()
        if settings.upstreams_file is not None:
            upstreams.reload(models, loop_caller(), reread)

    server = DrainingServer(config, app.state.runs, settings.shutdown_grace_secs, on_hangup=hangup)
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    console.print(f"Store: {settings.store_location()}")
    backend = settings.web_search_backend
    console.print(f"Web search: {backend or 'off (no --web-search-backend)'}")
    ids = ", ".join(e.model_id for e in models)
    console.print(f"respd serving [bold]{ids}[/] at http://{host}:{settings.port}/v1")
    try:
        server.run()
    finally:
        models.close()
        app.state.embeddings.close()
    return 0
