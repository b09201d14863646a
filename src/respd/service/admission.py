"""Hand a prompt to the engine, turning a full engine into OpenAI's 503."""

from __future__ import annotations

from collections.abc import Sequence

from respd.engines.base import Engine, EngineBusy, GenerationStream, Image, SamplingParams
from respd.protocol.errors import APIError

RETRY_AFTER_SECONDS = 1


def admit(
    engine: Engine,
    prompt: list[int],
    sampling: SamplingParams,
    cache_key: str | None,
    images: Sequence[Image] = (),
) -> GenerationStream:
    try:
        return engine.generate(prompt, sampling, cache_key=cache_key, images=images)
    except EngineBusy as exc:
        raise APIError(
            f"The server is overloaded: {exc}. Please retry shortly.",
            status_code=503,
            error_type="server_error",
            code="server_is_overloaded",
            headers={"retry-after": str(RETRY_AFTER_SECONDS)},
        ) from exc
