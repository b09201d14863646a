"""Grammar-constrained sampling that costs almost nothing while the model already complies.

llama-cpp-python puts llama.cpp's grammar sampler at the head of its sampler chain, so every
token's grammar check runs over the whole vocabulary (49k candidates for SmolLM2), which made
constrained generation 5-20x slower than free generation. llama.cpp's own server samples
first and consults the grammar afterwards; this does the same: sample with the normal chain,
check only the chosen token against the grammar, and only when it is rejected apply the
grammar to all candidates and sample again. The distribution sampled from is the same
(the constrained one) whenever the free choice is allowed, and exactly the constrained one
otherwise.

`install(llama, grammar)` sets it up for the next `Llama.generate` call through the `_init_sampler`
factory generate uses (llama-cpp-python is pinned, see pyproject.toml).
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import _internals


class GrammarCheckedSampler:
    """Stands in for llama-cpp-python's `LlamaSampler` inside `Llama.generate`."""

    def __init__(self, chain: _internals.LlamaSampler, vocab: Any, grammar: str, n_vocab: int):
        self._chain = chain
        self._grammar = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        if not self._grammar:
            raise ValueError("the grammar sampler rejected the grammar")
        self._n_vocab = n_vocab
        self._one = (llama_cpp.llama_token_data * 1)()
        self._one_array = llama_cpp.llama_token_data_array(
            data=ctypes.cast(self._one, llama_cpp.llama_token_data_p),
            size=1,
            selected=-1,
            sorted=False,
        )
        self._all = _internals.LlamaTokenDataArray(n_vocab=n_vocab)

    def _allowed(self, token: int) -> bool:
        self._one[0] = llama_cpp.llama_token_data(token, 0.0, 0.0)
        self._one_array.size = 1
        self._one_array.selected = -1
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(self._one_array))
        return not math.isinf(self._one[0].logit)

    def sample(self, ctx: _internals.LlamaContext, idx: int = -1) -> int:
        token = int(self._chain.sample(ctx, idx))
        if not self._allowed(token):
            logits = llama_cpp.llama_get_logits_ith(ctx.ctx, idx)
            self._all.copy_logits(np.ctypeslib.as_array(logits, shape=(self._n_vocab,)))
            candidates = ctypes.byref(self._all.candidates)
            llama_cpp.llama_sampler_apply(self._grammar, candidates)
            llama_cpp.llama_sampler_apply(self._chain.sampler, candidates)
            token = int(self._all.candidates_data.id[self._all.candidates.selected])
        llama_cpp.llama_sampler_accept(self._grammar, token)
        return token

    def __del__(self) -> None:
        if getattr(self, "_grammar", None):
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None


def install(llama: llama_cpp.Llama, grammar: str | None) -> None:
    """Make the next `llama.generate` sample under `grammar` (None: no grammar)."""
    llama.__dict__.pop("_init_sampler", None)  # a previous request's hook
    if grammar is None:
        return
    original = llama._init_sampler

    def init_sampler(**kwargs: Any) -> GrammarCheckedSampler:
        kwargs.pop("grammar", None)
        chain = original(**kwargs)
        return GrammarCheckedSampler(chain, llama._model.vocab, grammar, llama.n_vocab())

    setattr(llama, "_init_sampler", init_sampler)  # noqa: B010 - shadows the method
