"""The models this server answers for: each id maps to the engine that serves it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from respd.engines.base import Engine
from respd.protocol.errors import model_not_found


class ModelRegistry:
    """Ids resolve exactly, or a bare name resolves to the one `vendor/name` id ending in
    it. The table may be swapped whole (upstreams re-read) while requests read it."""

    def __init__(self, engines: Iterable[Engine]) -> None:
        self._engines = self._table(engines)
        if not self._engines:
            raise ValueError("a server needs at least one model")

    @staticmethod
    def _table(engines: Iterable[Engine]) -> dict[str, Engine]:
        table: dict[str, Engine] = {}
        for engine in engines:
            if engine.model_id in table:
                raise ValueError(f"two engines serve the same model id: {engine.model_id}")
            table[engine.model_id] = engine
        return table

    def get(self, model: str) -> Engine:
        """The engine serving `model`; an unknown id is OpenAI's 404 `model_not_found`."""
        engines = self._engines
        engine = engines.get(model)
        if engine is None and "/" not in model:
            named = [e for m, e in engines.items() if m.rpartition("/")[2] == model]
            engine = named[0] if len(named) == 1 else None
        if engine is None:
            raise model_not_found(model)
        return engine

    def default(self) -> Engine:
        """The first model: what a request that names none (input token counts) uses."""
        return next(iter(self._engines.values()))

    def replace(self, old_ids: Iterable[str], engines: Iterable[Engine]) -> None:
        """Swap the engines under `old_ids` for `engines` (raises `ValueError`, changing
        nothing, when an id would be served twice)."""
        gone = set(old_ids)
        kept = [e for m, e in self._engines.items() if m not in gone]
        self._engines = self._table([*kept, *engines])

    def __iter__(self) -> Iterator[Engine]:
        return iter(list(self._engines.values()))

    def close(self) -> None:
        for engine in self._engines.values():
            engine.close()
