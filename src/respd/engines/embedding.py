"""Embedding models: what `/v1/embeddings` asks of an engine that turns text into vectors.

An embedder is a capability beside generation: the local chat model can embed (through a
second llama.cpp context in embedding mode), a separate embedding GGUF can, and a remote
server does it itself. Vectors come back L2-normalized, as OpenAI's do, so that a dot
product is a cosine."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

# One input: text, or token ids the client tokenized itself.
EmbeddingInput = str | list[int]


@dataclass
class Embeddings:
    vectors: list[list[float]]  # one per input, in order
    prompt_tokens: int  # the inputs' tokens, summed


class InputTooLong(Exception):
    """Input `index` has more tokens than the embedder reads at once."""

    def __init__(self, index: int, n_tokens: int, limit: int) -> None:
        super().__init__(f"input {index} has {n_tokens} tokens; at most {limit} fit")
        self.index = index
        self.n_tokens = n_tokens
        self.limit = limit


class TokenOutOfRange(Exception):
    """Input `index` holds a token id the model's vocabulary does not."""

    def __init__(self, index: int, n_vocab: int) -> None:
        super().__init__(f"input {index} holds a token id outside 0..{n_vocab - 1}")
        self.index = index
        self.n_vocab = n_vocab


class EmbeddingFailed(Exception):
    """A remote embedder refused or failed; `status` is what the client gets (the remote's
    own 4xx, 502 or 504)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Embedder(Protocol):
    model_id: str
    # Tokens one input may have (None: a remote server checks lengths itself).
    max_tokens: int | None

    async def embed(self, inputs: list[EmbeddingInput]) -> Embeddings:
        """One unit vector per input; raises `InputTooLong`, `TokenOutOfRange` or
        `EmbeddingFailed`."""
        ...

    def close(self) -> None: ...


def normalized(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else vector
