"""Token log-probabilities read off a decoded row of logits.

What a logprob means here: the natural-log probability of a token under the model's **raw**
next-token distribution at that position, the log-softmax of the logits llama.cpp computed,
*before* temperature, top-k / top-p / min-p, presence/frequency penalties or a grammar
reshape it (vLLM's default, `raw_logprobs`). It is the same number whatever the sampling
settings, so it measures the model, not the sampler; the flip side is that a hot or
constrained sampler may pick a token the raw distribution ranks low (and with free greedy
sampling the chosen token is always the top-1 alternative).

Tokens are given as the engine emits them: the token's piece (`special=False`, so a control
token such as `<|im_end|>` is an empty piece), `bytes` its raw UTF-8 bytes (a piece may be
part of a multi-byte character; joining the bytes of consecutive tokens gives the text) and
`token` those bytes decoded with U+FFFD for an incomplete sequence.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from respd.engines.base import TokenLogprob, TopLogprob


class LogprobReader:
    """Computes `TokenLogprob`s from llama.cpp logits rows of a vocabulary of `n_vocab`.

    `piece(token)` gives a token's bytes; pieces of alternatives are cached (a vocabulary's
    worth at most), the sampled token's piece is passed in by the caller, who has it already.
    """

    def __init__(self, n_vocab: int, piece: Callable[[int], bytes]) -> None:
        self._n_vocab = n_vocab
        self._piece = piece
        self._pieces: dict[int, bytes] = {}

    def _cached_piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._piece(token)
        return piece

    def read(self, logits: Any, token: int, piece: bytes, top: int) -> TokenLogprob:
        """`logits`: a ctypes float pointer to one row (`llama_get_logits_ith`), read in
        place; `token`: the sampled token, whose piece is `piece`; `top`: how many of the
        most likely tokens to list as alternatives (most likely first; equal logits in
        token-id order, the order llama.cpp's greedy sampler breaks ties in)."""
        # Read in place (llama.cpp owns the row; nothing here writes to it). The float32
        # exponentials are summed in float64: log Z is exact to ~1e-7.
        row = np.ctypeslib.as_array(logits, shape=(self._n_vocab,))
        peak = float(row.max())
        log_z = peak + math.log(float(np.exp(row - np.float32(peak)).sum(dtype=np.float64)))
        alternatives: list[TopLogprob] = []
        top = min(top, self._n_vocab)
        if top > 0:
            ids = np.argpartition(row, -top)[-top:]
            ids = ids[np.lexsort((ids, -row[ids]))]
            for t in ids.tolist():
                p = piece if t == token else self._cached_piece(t)
                alternatives.append(TopLogprob(_text(p), list(p), float(row[t]) - log_z))
        return TokenLogprob(_text(piece), list(piece), float(row[token]) - log_z, alternatives)


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")
