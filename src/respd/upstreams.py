"""The upstream models: `--upstream` entries and `--upstreams-file` tables built into
engines — one upstream engine per plain entry, one routed engine per public id that
entries share — and the file re-read on SIGHUP."""

from __future__ import annotations

import asyncio
import logging
import threading
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path

import httpx

from respd.config import Settings
from respd.engines.base import Engine
from respd.engines.routing import Breaker, Provider, RoutedEngine
from respd.engines.upstream import UpstreamEngine, UpstreamSpec
from respd.service.models import ModelRegistry

log = logging.getLogger(__name__)


class UpstreamsError(Exception):
    """An entry or the file is wrong: start-up stops with the reason."""


def read_upstreams_file(path: Path) -> list[UpstreamSpec]:
    """The `[[upstream]]` tables of a TOML file."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UpstreamsError(f"cannot read {path}: {exc}") from None
    tables = data.get("upstream", [])
    unknown = sorted(set(data) - {"upstream"})
    if unknown or not isinstance(tables, list):
        raise UpstreamsError(f"{path}: expected only [[upstream]] tables, not {unknown}")
    specs = []
    for i, table in enumerate(tables):
        try:
            specs.append(UpstreamSpec.from_mapping(table))
        except ValueError as exc:
            raise UpstreamsError(f"{path}: upstream #{i + 1}: {exc}") from None
    return specs


def discover_model(spec: UpstreamSpec) -> str:
    """The model name to send: the entry's `model`, else the first the upstream lists."""
    if spec.model:
        return spec.model
    headers = {"authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    try:
        models = httpx.get(spec.url.rstrip("/") + "/models", headers=headers, timeout=10)
        models.raise_for_status()
        listed = [m["id"] for m in models.json().get("data", [])]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise UpstreamsError(f"the upstream at {spec.url} did not list its models: {exc}") from None
    if not listed:
        raise UpstreamsError(f"the upstream at {spec.url} lists no models; name one")
    return str(listed[0])


class Upstreams:
    """Builds engines from entries, keeping each routed provider's measurements and
    circuit across a reload when its entry did not change."""

    def __init__(self, settings: Settings, say: Callable[[str], None] = log.info) -> None:
        self.settings = settings
        self.say = say
        self._providers: dict[UpstreamSpec, Provider] = {}
        self._plain: dict[UpstreamSpec, UpstreamEngine] = {}
        self.model_ids: list[str] = []  # the ids the last build served
        self._reloading = threading.Lock()

    def specs(self) -> list[UpstreamSpec]:
        """The flag's entries, then the file's."""
        specs = []
        for entry in self.settings.upstream:
            try:
                specs.append(UpstreamSpec.parse(entry))
            except ValueError as exc:
                raise UpstreamsError(f"--upstream {entry!r}: {exc}") from None
        if self.settings.upstreams_file is not None:
            specs += read_upstreams_file(self.settings.upstreams_file.expanduser())
        return specs

    def engine(self, spec: UpstreamSpec, *, model_id: str | None = None) -> UpstreamEngine:
        name = discover_model(spec)
        s = self.settings
        engine = UpstreamEngine(
            spec.url,
            model_id=model_id or spec.alias or name,
            upstream_model=name,
            api_key=spec.api_key,
            context_window=spec.context_window or s.ctx_size,
            vision=spec.vision,
            forces_tools=spec.forces_tools,
            enforces_schemas=spec.enforces_schemas,
            max_concurrency=spec.concurrency or s.parallel + s.max_queue,
        )
        self.say(f"Upstream {spec.url}: model {name} (served as {engine.model_id})")
        return engine

    def build(self, specs: Iterable[UpstreamSpec]) -> list[Engine]:
        """One engine per public id, in the order the ids first appear."""
        groups: dict[str, list[UpstreamSpec]] = {}
        for spec in specs:
            groups.setdefault(spec.public_id or spec.url, []).append(spec)
        engines: list[Engine] = []
        providers: dict[UpstreamSpec, Provider] = {}
        plain: dict[UpstreamSpec, UpstreamEngine] = {}
        for public_id, group in groups.items():
            if len(group) == 1 and not group[0].routed:
                spec = group[0]
                engine = self._plain.get(spec) or self.engine(spec)
                plain[spec] = engine
                engines.append(engine)
                continue
            names = [s.alias for s in group]
            if len(set(names)) != len(names):
                raise UpstreamsError(f"two entries of {public_id} share an alias: {names}")
            chosen = []
            for spec in group:
                provider = self._providers.get(spec) or self._provider(spec, public_id)
                providers[spec] = provider
                chosen.append(provider)
            engines.append(RoutedEngine(public_id, chosen))
        self._providers, self._plain = providers, plain
        self.model_ids = [e.model_id for e in engines]
        return engines

    def _provider(self, spec: UpstreamSpec, public_id: str) -> Provider:
        s = self.settings
        return Provider(
            spec.provider_name,
            spec.alias or spec.url,
            self.engine(spec, model_id=f"{public_id}@{spec.provider_name}"),
            price_prompt=spec.price_prompt,
            price_completion=spec.price_completion,
            first_byte_timeout=spec.timeout or s.provider_timeout_secs,
            breaker=Breaker(s.provider_breaker_failures, s.provider_breaker_cooldown_secs),
        )

    def _reload(
        self,
        registry: ModelRegistry,
        on_loop: Callable[[Callable[[], None]], None],
        on_replaced: Callable[[list[Engine]], None] | None,
    ) -> None:
        before = (self._plain, self._providers, self.model_ids)
        old = _engines_of(self._plain, self._providers)
        try:
            engines = self.build(self.specs())
            registry.replace(before[2], engines)
        except (UpstreamsError, ValueError) as exc:
            # What this build made is dropped, what was in force stays in force.
            made = _engines_of(self._plain, self._providers)
            self._plain, self._providers, self.model_ids = before
            for engine in made:
                if all(engine is not kept for kept in old):
                    on_loop(engine.close)
            log.error("upstreams not reloaded: %s", exc)
            return
        if on_replaced is not None:
            on_replaced(engines)
        now = _engines_of(self._plain, self._providers)
        for engine in old:
            if all(engine is not kept for kept in now):
                on_loop(engine.close)
        log.info("upstreams reloaded: %s", ", ".join(e.model_id for e in engines))

    def reload(
        self,
        registry: ModelRegistry,
        on_loop: Callable[[Callable[[], None]], None],
        on_replaced: Callable[[list[Engine]], None] | None = None,
    ) -> None:
        """Read the entries again and put the engines they make in `registry` (on a
        thread of its own: a new entry may be asked for its models). A file or entry in
        error is logged and changes nothing."""

        def work() -> None:
            with self._reloading:  # two hang-ups in a row: one reload after the other
                self._reload(registry, on_loop, on_replaced)

        threading.Thread(target=work, name="respd-upstreams", daemon=True).start()


def _engines_of(
    plain: dict[UpstreamSpec, UpstreamEngine], providers: dict[UpstreamSpec, Provider]
) -> list[Engine]:
    return [*plain.values(), *(p.engine for p in providers.values())]


def loop_caller() -> Callable[[Callable[[], None]], None]:
    """Runs a callable on the serving event loop (from any thread), or at once where
    there is none."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return lambda fn: fn()

    def call(fn: Callable[[], None]) -> None:
        loop.call_soon_threadsafe(fn)

    return call
