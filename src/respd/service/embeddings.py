"""Embeddings: the request checked, the embedder that serves its model, OpenAI's answer.

Vectors come back as the embedder made them (unit length) or, with `dimensions`, cut to
their first `dimensions` values and scaled back to unit length — the Matryoshka reading
that OpenAI's `text-embedding-3` models offer, and that keeps cosines meaningful for a
model trained for it. `base64` is the vector's little-endian float32 bytes, as the `openai`
SDKs decode it."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable, Iterator
from typing import Any

from respd.engines.embedding import (
    Embedder,
    EmbeddingFailed,
    EmbeddingInput,
    InputTooLong,
    TokenOutOfRange,
    normalized,
)
from respd.protocol.embeddings import MAX_INPUTS, EmbeddingRequest
from respd.protocol.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    UpstreamFailed,
    model_not_found,
)
from respd.service.limits import InputLimits


class EmbeddingModels:
    """The embedders this server answers for, by model id."""

    def __init__(self, embedders: Iterable[Embedder] = (), limits: InputLimits | None = None):
        self._embedders = {e.model_id: e for e in embedders}
        self.limits = limits or InputLimits()

    def __iter__(self) -> Iterator[Embedder]:
        return iter(self._embedders.values())

    def get(self, model: str) -> Embedder:
        embedder = self._embedders.get(model)
        if embedder is None:
            raise model_not_found(model)
        return embedder

    def close(self) -> None:
        for embedder in self._embedders.values():
            embedder.close()


def _inputs(raw: Any, max_chars: int) -> list[EmbeddingInput]:
    """The request's `input` as a list of items (a string, or token ids)."""
    if isinstance(raw, str):
        items: list[EmbeddingInput] = [raw]
    elif raw and all(isinstance(x, int) for x in raw):
        items = [list(raw)]
    else:
        items = list(raw)
    if not items:
        raise InvalidRequest("'input' must not be empty.", param="input", code="invalid_value")
    if len(items) > MAX_INPUTS:
        raise InvalidRequest(
            f"'input' holds {len(items)} items; at most {MAX_INPUTS} are allowed.",
            param="input",
            code="invalid_value",
        )
    size = sum(len(item) for item in items)  # characters, or token ids
    if size > max_chars:  # before tokenizing: the tokenizer would read it all first
        raise InvalidRequest(
            f"The input holds {size} characters or tokens, more than the {max_chars} this "
            "server accepts in one request.",
            param="input",
            code="string_above_max_length",
        )
    for i, item in enumerate(items):
        if len(item) == 0:
            raise InvalidRequest(
                f"'input[{i}]' is empty: there is nothing to embed.",
                param=f"input[{i}]",
                code="invalid_value",
            )
    return items


def _shaped(vector: list[float], dimensions: int | None, encoding: str) -> list[float] | str:
    if dimensions is not None:
        vector = normalized(vector[:dimensions])
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


async def create_embeddings(models: EmbeddingModels, req: EmbeddingRequest) -> dict[str, Any]:
    embedder = models.get(req.model)
    items = _inputs(req.input, models.limits.max_chars)
    try:
        made = await embedder.embed(items)
    except InputTooLong as exc:
        raise ContextLengthExceeded(
            f"'input[{exc.index}]' has {exc.n_tokens} tokens; this model embeds at most "
            f"{exc.limit} at once.",
            param=f"input[{exc.index}]",
        ) from None
    except EmbeddingFailed as exc:
        raise UpstreamFailed(str(exc), exc.status) from None
    except TokenOutOfRange as exc:
        raise InvalidRequest(
            f"'input[{exc.index}]' holds a token id outside this model's vocabulary "
            f"(0 to {exc.n_vocab - 1}).",
            param=f"input[{exc.index}]",
            code="invalid_value",
        ) from None
    width = len(made.vectors[0]) if made.vectors else 0
    if req.dimensions is not None and req.dimensions > width:
        raise InvalidRequest(
            f"'dimensions' is {req.dimensions}; this model's vectors have {width}.",
            param="dimensions",
            code="invalid_value",
        )
    return {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": i,
                "embedding": _shaped(vector, req.dimensions, req.encoding_format),
            }
            for i, vector in enumerate(made.vectors)
        ],
        "model": req.model,
        "usage": {"prompt_tokens": made.prompt_tokens, "total_tokens": made.prompt_tokens},
    }
