"""The models this server answers for: each id maps to the engine that serves it.

Engines given at start are always there. Local models (`LocalModel`) load on first use,
on a thread, one load shared by every request that waits for it, and are unloaded by the
pool's policy: the least recently used, unpinned and running nothing, first when a load
needs room (`models_max`, `memory_bytes`), and any idle past its time to live.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from respd.engines.base import Engine
from respd.protocol.errors import APIError, model_not_found

log = logging.getLogger(__name__)

# A model used this recently is not unloaded: its request may not have reached the engine
# yet (it was looked up, its input is still being prepared). Should one be unloaded even so,
# the engine refuses the late request with a 503 to retry, never runs it on freed memory.
IN_USE_GRACE_SECS = 0.5
HOUSEKEEPING_SECS = 1.0
WAIT_FOR_ROOM_SECS = 60.0


@dataclass
class LocalModel:
    """A model this server loads when first asked for. `load` blocks (it runs on a
    thread); `memory_bytes` is its estimate once loaded (weights and KV cache)."""

    model_id: str
    load: Callable[[], Engine]
    memory_bytes: int = 0
    context_window: int | None = None
    vision: bool = False
    slots: int | None = None  # requests it decodes at once (None: the server's default)
    pin: bool = False
    ttl: float | None = None  # idle seconds before unloading; None: the pool's default
    source: str = ""  # where it loads from, for listings


@dataclass(frozen=True)
class PoolLimits:
    max_loaded: int = 0  # 0: no limit
    memory_bytes: int = 0  # 0: no limit
    idle_secs: float = 0.0  # 0: never unload for idleness


@dataclass
class _Slot:
    model: LocalModel
    engine: Engine | None = None
    loading: asyncio.Task[Engine] | None = None
    last_used: float = 0.0
    loads: int = 0
    error: str | None = None


class ModelLoadFailed(APIError):
    status_code = 503
    error_type = "server_error"


def _busy(engine: Engine) -> bool:
    stats = engine.stats()
    return stats.running > 0 or stats.queued > 0


@dataclass
class ModelState:
    """One model as `/v1/models` lists it: loaded or not, and what it is."""

    model_id: str
    engine: Engine | None
    local: LocalModel | None = None
    loads: int = 0
    error: str | None = None


class ModelRegistry:
    """Ids resolve exactly, or a bare name resolves to the one `vendor/name` id ending in
    it. The table of fixed engines may be swapped whole (upstreams re-read) while requests
    read it."""

    def __init__(
        self,
        engines: Iterable[Engine] = (),
        *,
        local: Iterable[LocalModel] = (),
        limits: PoolLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engines = self._table(engines)
        self._local = {m.model_id: _Slot(m) for m in local}
        clash = set(self._engines) & set(self._local)
        if clash:
            raise ValueError(f"two models share the id {sorted(clash)[0]}")
        if not self._engines and not self._local:
            raise ValueError("a server needs at least one model")
        self.limits = limits or PoolLimits()
        self._clock = clock
        self._housekeeper: asyncio.Task[None] | None = None
        self._room = asyncio.Lock() if self._local else None

    @staticmethod
    def _table(engines: Iterable[Engine]) -> dict[str, Engine]:
        table: dict[str, Engine] = {}
        for engine in engines:
            if engine.model_id in table:
                raise ValueError(f"two engines serve the same model id: {engine.model_id}")
            table[engine.model_id] = engine
        return table

    # -- looking models up ----------------------------------------------------------------

    def resolve(self, model: str) -> str:
        """The id `model` names (exactly, or as the bare name of one `vendor/name` id)."""
        ids = [*self._engines, *self._local]
        if model in ids:
            return model
        if "/" not in model:
            named = [m for m in ids if m.rpartition("/")[2] == model]
            if len(named) == 1:
                return named[0]
        raise model_not_found(model)

    async def ready(self, model: str) -> Engine:
        """The engine serving `model`, loaded first when it is a local model not loaded
        (a failed load is a 503 naming the model and why)."""
        model_id = self.resolve(model)
        engine = self._engines.get(model_id)
        if engine is not None:
            return engine
        slot = self._local[model_id]
        slot.last_used = self._clock()
        if slot.engine is not None:
            return slot.engine
        if slot.loading is None:
            slot.loading = asyncio.ensure_future(self._load(slot))
        try:
            # Shielded: a client that leaves does not cancel a load others wait for.
            return await asyncio.shield(slot.loading)
        finally:
            slot.last_used = self._clock()

    def needs_load(self, model: str) -> bool:
        """Whether `model` is a local model that is not loaded (an unknown id: False, so
        the request meets its 404 the usual way)."""
        try:
            slot = self._local.get(self.resolve(model))
        except APIError:
            return False
        return slot is not None and slot.engine is None

    def default_id(self) -> str:
        """The first model's id: what a request that names none (input token counts) uses."""
        return next(iter([*self._engines, *self._local]))

    def __iter__(self) -> Iterator[Engine]:
        """The engines serving now (fixed ones and loaded local ones)."""
        loaded = [s.engine for s in self._local.values() if s.engine is not None]
        return iter([*self._engines.values(), *loaded])

    def states(self) -> list[ModelState]:
        """Every model, loaded or not, in the order they were given."""
        states = [ModelState(m, e) for m, e in self._engines.items()]
        for model_id, slot in self._local.items():
            states.append(ModelState(model_id, slot.engine, slot.model, slot.loads, slot.error))
        return states

    def replace(self, old_ids: Iterable[str], engines: Iterable[Engine]) -> None:
        """Swap the fixed engines under `old_ids` for `engines` (raises `ValueError`,
        changing nothing, when an id would be served twice)."""
        gone = set(old_ids)
        kept = [e for m, e in self._engines.items() if m not in gone]
        table = self._table([*kept, *engines])
        clash = set(table) & set(self._local)
        if clash:
            raise ValueError(f"two models share the id {sorted(clash)[0]}")
        self._engines = table

    # -- loading and unloading ------------------------------------------------------------

    def preload(self, model_id: str) -> Engine:
        """Load a local model before serving (a pinned one), on this thread."""
        slot = self._local[model_id]
        slot.engine = slot.model.load()
        slot.loads += 1
        slot.last_used = self._clock()
        return slot.engine

    def local_models(self) -> list[LocalModel]:
        return [slot.model for slot in self._local.values()]

    async def unload(self, model: str) -> bool:
        """Unload a local model now, unless it runs a request (a 409 then); False when it
        was not loaded."""
        model_id = self.resolve(model)
        slot = self._local.get(model_id)
        if slot is None:
            raise APIError(
                f"The model {model_id} is not a local model; it cannot be unloaded.",
                status_code=409,
                code="model_not_unloadable",
            )
        if slot.engine is None:
            return False
        if _busy(slot.engine):
            raise APIError(
                f"The model {model_id} is running requests; unload it once they finish.",
                status_code=409,
                code="model_busy",
            )
        self._unload(slot, "on request")
        return True

    async def _load(self, slot: _Slot) -> Engine:
        model = slot.model
        try:
            assert self._room is not None
            async with self._room:  # one load at a time decides what to unload for room
                await self._make_room(slot)
                started = time.monotonic()
                engine = await asyncio.to_thread(model.load)
            slot.engine, slot.error = engine, None
            slot.loads += 1
            slot.last_used = self._clock()
            log.info("loaded %s in %.1fs", model.model_id, time.monotonic() - started)
            self._start_housekeeping()
            return engine
        except APIError:
            raise
        except Exception as exc:  # a corrupt file, too little memory, a bad template
            slot.error = f"{type(exc).__name__}: {exc}"
            log.error("cannot load %s: %s", model.model_id, slot.error)
            raise ModelLoadFailed(
                f"The model {model.model_id} could not be loaded: {exc}",
                code="model_load_failed",
            ) from exc
        finally:
            slot.loading = None

    def _loaded(self) -> list[_Slot]:
        return [s for s in self._local.values() if s.engine is not None]

    def _fits(self, slot: _Slot) -> bool:
        loaded = self._loaded()
        limits = self.limits
        if limits.max_loaded and len(loaded) + 1 > limits.max_loaded:
            return False
        if limits.memory_bytes:
            used = sum(s.model.memory_bytes for s in loaded)
            if used + slot.model.memory_bytes > limits.memory_bytes and loaded:
                return False
        return True

    async def _make_room(self, slot: _Slot) -> None:
        """Unload the least recently used idle models until `slot` fits; wait for one to
        go idle when every candidate is busy."""
        deadline = time.monotonic() + WAIT_FOR_ROOM_SECS
        while not self._fits(slot):
            now = self._clock()
            idle = sorted(
                (
                    s
                    for s in self._loaded()
                    if not s.model.pin
                    and s.engine is not None
                    and not _busy(s.engine)
                    and now - s.last_used >= IN_USE_GRACE_SECS
                ),
                key=lambda s: s.last_used,
            )
            if idle:
                self._unload(idle[0], f"to load {slot.model.model_id}")
                continue
            candidates = [s for s in self._loaded() if not s.model.pin]
            if not candidates or time.monotonic() > deadline:
                raise ModelLoadFailed(
                    f"The model {slot.model.model_id} cannot be loaded: the models loaded "
                    "are pinned or busy, and the limits (--models-max, --models-memory-mb) "
                    "leave no room. Retry shortly.",
                    code="model_pool_full",
                    headers={"retry-after": "1"},
                )
            await asyncio.sleep(0.05)

    def _unload(self, slot: _Slot, why: str) -> None:
        engine, slot.engine = slot.engine, None
        if engine is not None:
            log.info("unloading %s (%s)", slot.model.model_id, why)
            engine.close()

    def _start_housekeeping(self) -> None:
        if self._housekeeper is None or self._housekeeper.done():
            self._housekeeper = asyncio.ensure_future(self._housekeeping())

    async def _housekeeping(self) -> None:
        """Unload models idle past their time to live, while any is loaded."""
        while self._loaded():
            await asyncio.sleep(HOUSEKEEPING_SECS)
            now = self._clock()
            for slot in self._loaded():
                ttl = slot.model.ttl if slot.model.ttl is not None else self.limits.idle_secs
                engine = slot.engine
                if engine is not None and _busy(engine):
                    slot.last_used = now  # idle time counts from the end of its last request
                    continue
                if slot.model.pin or not ttl or engine is None:
                    continue
                if now - slot.last_used >= ttl and slot.loading is None:
                    self._unload(slot, f"idle for {ttl:g}s")

    def close(self) -> None:
        if self._housekeeper is not None:
            with contextlib.suppress(RuntimeError):  # its loop may be closed already
                self._housekeeper.cancel()
        for engine in self._engines.values():
            engine.close()
        for slot in self._local.values():
            with contextlib.suppress(Exception):
                self._unload(slot, "shutting down")
