"""The models this server answers for: each id maps to the engine that serves it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from respd.engines.base import Engine
from respd.protocol.errors import model_not_found


class ModelRegistry:
    def __init__(self, engines: Iterable[Engine]) -> None:
        self._engines = {e.model_id: e for e in engines}
        if not self._engines:
            raise ValueError("a server needs at least one model")

    def get(self, model: str) -> Engine:
        """The engine serving `model`; an unknown id is OpenAI's 404 `model_not_found`."""
        engine = self._engines.get(model)
        if engine is None:
            raise model_not_found(model)
        return engine

    def default(self) -> Engine:
        """The first model: what a request that names none (input token counts) uses."""
        return next(iter(self._engines.values()))

    def __iter__(self) -> Iterator[Engine]:
        return iter(self._engines.values())

    def close(self) -> None:
        for engine in self._engines.values():
            engine.close()
