"""Grammar-constrained sampling that costs almost nothing while the model already complies.

Applying llama.cpp's grammar sampler to every candidate of every step checks the whole
vocabulary (49k tokens for SmolLM2) each time, which made constrained generation 5-20x
slower than free generation. llama.cpp's own server samples first and consults the grammar
afterwards; so does this: sample with the normal chain, check only the chosen token against
the grammar, and only when it is rejected apply the grammar to candidates and sample again.
The result follows the constrained distribution either way.

A rejected first choice is common in structured output (the model wants a newline where
the grammar wants a quote), and a grammar check of the whole vocabulary takes ~7 ms on two
cores, about half a decode step. When the chain keeps only the `k` likeliest tokens and
nothing in it changes logits before that cut (greedy: k = 1; top-k sampling with no
penalty, bias or DRY), only the likeliest few hundred tokens are checked: if `k` of them
pass, they are exactly the `k` likeliest tokens the grammar allows, the same candidates the
chain would keep after a full check, so the sample is the same.
"""

from __future__ import annotations

import ctypes
import math
import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import _internals

from respd.engines.base import SamplingParams

# Sampling when neither the request nor the GGUF metadata says otherwise (llama-server's).
FALLBACK_SAMPLING = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05}
# GGUF keys where a model's authors recommend its sampling (`general.sampling.*`).
SAMPLING_METADATA = {
    "temperature": "general.sampling.temp",
    "top_p": "general.sampling.top_p",
    "top_k": "general.sampling.top_k",
    "min_p": "general.sampling.min_p",
    "repeat_penalty": "general.sampling.penalty_repeat",
}
PENALTY_LAST_N = 64  # tokens the repetition penalties look back over
# DRY when neither the request nor the server says otherwise: llama-server's (off; the
# base, allowed length and breakers apply once a multiplier switches it on).
FALLBACK_DRY = {
    "dry_multiplier": 0.0,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": -1,
}
DRY_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")


# How many of the likeliest tokens a rejected first choice checks before the whole vocabulary.
GRAMMAR_WINDOW = 256


class Candidates:
    """A buffer of token candidates reused step after step, and the llama.cpp array over it
    that samplers take (a grammar sets a token it rejects to -inf)."""

    def __init__(self, capacity: int) -> None:
        self.data = (llama_cpp.llama_token_data * max(1, capacity))()
        self.array = llama_cpp.llama_token_data_array(
            data=ctypes.cast(self.data, llama_cpp.llama_token_data_p),
            size=capacity,
            selected=-1,
            sorted=False,
        )

    def put(self, i: int, token: int, logit: float = 0.0) -> None:
        self.data[i] = llama_cpp.llama_token_data(token, logit, 0.0)

    def apply(self, sampler: Any, size: int) -> None:
        """Apply `sampler` to the first `size` candidates."""
        self.array.size, self.array.selected, self.array.sorted = size, -1, False
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(self.array))

    def rejected(self, i: int) -> bool:
        return math.isinf(self.data[i].logit)

    def passing(self, sampler: Any, tokens: Sequence[int], logits: np.ndarray) -> list[int]:
        """Of `tokens` (at most the capacity), those `sampler` leaves standing, in order."""
        for i, token in enumerate(tokens):
            self.put(i, token, float(logits[token]))
        self.apply(sampler, len(tokens))
        return [int(self.data[i].id) for i in range(len(tokens)) if not self.rejected(i)]


class GrammarCheckedSampler:
    """A sampler chain (`chain`, a llama.cpp sampler pointer) constrained by a GBNF grammar.
    `top`: the chain keeps only that many likeliest tokens and changes no logit before (see
    `chain_top`); None: a rejected choice checks the whole vocabulary."""

    def __init__(
        self, chain: Any, vocab: Any, grammar: str, n_vocab: int, top: int | None = None
    ) -> None:
        self._chain = chain
        self._top = top if top is not None and 0 < top <= GRAMMAR_WINDOW // 4 else None
        self._window = Candidates(GRAMMAR_WINDOW)
        self._grammar = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        if not self._grammar:
            raise ValueError("the grammar sampler rejected the grammar")
        self._n_vocab = n_vocab
        self._one = Candidates(1)
        self._closers: Candidates | None = None  # sized at the first closing sample
        self._all = _internals.LlamaTokenDataArray(n_vocab=n_vocab) if n_vocab else None

    def _allowed(self, token: int) -> bool:
        self._one.put(0, token)
        self._one.apply(self._grammar, 1)
        return not self._one.rejected(0)

    def sample(self, ctx: Any, idx: int) -> int:
        """Sample the token at batch index `idx` of context pointer `ctx`."""
        token = int(llama_cpp.llama_sampler_sample(self._chain, ctx, idx))
        if not self._allowed(token) and (token := self._sample_window(ctx, idx)) < 0:
            assert self._all is not None
            self._all.copy_logits(self._logits(ctx, idx))
            candidates = ctypes.byref(self._all.candidates)
            llama_cpp.llama_sampler_apply(self._grammar, candidates)
            llama_cpp.llama_sampler_apply(self._chain, candidates)
            token = int(self._all.candidates_data.id[self._all.candidates.selected])
        llama_cpp.llama_sampler_accept(self._grammar, token)
        return token

    def _sample_window(self, ctx: Any, idx: int) -> int:
        """The chain's sample among the likeliest tokens the grammar allows, checking only
        the `GRAMMAR_WINDOW` likeliest; -1 when that cannot be the full check's answer."""
        if self._top is None:
            return -1
        logits = self._logits(ctx, idx)
        kept = self._window.passing(self._grammar, self._likeliest(logits), logits)
        if len(kept) < self._top:
            return -1
        for i, token in enumerate(kept):
            self._window.put(i, token, float(logits[token]))
        self._window.apply(self._chain, len(kept))
        return int(self._window.data[self._window.array.selected].id)

    def _logits(self, ctx: Any, idx: int) -> np.ndarray:
        logits = llama_cpp.llama_get_logits_ith(ctx, idx)
        return np.ctypeslib.as_array(logits, shape=(self._n_vocab,))

    @staticmethod
    def _likeliest(logits: np.ndarray) -> list[int]:
        """The `GRAMMAR_WINDOW` likeliest tokens, likeliest first."""
        ids = np.argpartition(logits, -GRAMMAR_WINDOW)[-GRAMMAR_WINDOW:]
        return [int(t) for t in ids[np.argsort(-logits[ids], kind="stable")]]

    @property
    def grammar(self) -> Any:
        """The grammar sampler (a llama.cpp pointer), for `closing.Closer` to clone."""
        return self._grammar

    def sample_closing(
        self, ctx: Any, idx: int, preference: np.ndarray, closers: np.ndarray
    ) -> tuple[int, bool]:
        """The token at `idx` that most closes the grammar's value: among the tokens the
        grammar allows, those of the highest `preference` (see `closing.ClosingVocab`), of
        them the model's likeliest. Also whether that differs from the model's own first
        choice among the allowed tokens (the budget, not the model, chose it). `closers`:
        every token of positive preference."""
        logits = self._logits(ctx, idx)
        picked = self._closing_window(logits, preference, closers)
        if picked is None:
            picked = self._closing_whole(logits, preference)
        if picked is None:  # nothing fits: let the usual path report it
            return self.sample(ctx, idx), False
        token, own = picked
        self._accept(token)
        return token, token != own

    def take(self, token: int) -> bool:
        """Take `token` as the next one without sampling, if the grammar allows it."""
        if not self._allowed(token):
            return False
        self._accept(token)
        return True

    def _accept(self, token: int) -> None:
        """Advance the grammar and the chain by a token chosen outside the chain's sample
        (which advances the chain itself)."""
        llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)

    def _closing_window(
        self, logits: np.ndarray, preference: np.ndarray, closers: np.ndarray
    ) -> tuple[int, int] | None:
        """`sample_closing`'s choice and the model's own, from the likeliest tokens and the
        closers alone (a few hundred grammar checks, not the whole vocabulary); None when
        those cannot decide it. Exact: every token that closes anything is a closer, and
        if an allowed plain token is among the likeliest, so is the likeliest of them."""
        allowed = self._window.passing(self._grammar, self._likeliest(logits), logits)
        if not allowed:
            return None
        if self._closers is None or len(self._closers.data) < len(closers):
            self._closers = Candidates(len(closers))
        closing = np.array(self._closers.passing(self._grammar, closers.tolist(), logits))
        if len(closing):
            best = closing[preference[closing] == preference[closing].max()]
            # The likeliest; of equals, the lowest id (as an argmax over the vocabulary).
            return int(best[np.lexsort((best, -logits[best]))[0]]), allowed[0]
        plain = [t for t in allowed if preference[t] == 0]
        return (plain[0], allowed[0]) if plain else None

    def _closing_whole(self, logits: np.ndarray, preference: np.ndarray) -> tuple[int, int] | None:
        """`sample_closing`'s choice and the model's own over the whole vocabulary."""
        assert self._all is not None
        self._all.copy_logits(logits)
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(self._all.candidates))
        scores = self._all.candidates_data.logit  # the disallowed at -inf; ids in order
        allowed = np.isfinite(scores)
        if not allowed.any():
            return None
        best = preference[allowed].max()
        token = int(np.argmax(np.where(allowed & (preference == best), scores, -np.inf)))
        return token, int(np.argmax(scores))

    def close(self) -> None:
        if self._grammar:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None

    def __del__(self) -> None:
        self.close()


def logit_bias(n_vocab: int, biases: Mapping[int, float]) -> Any:
    """A llama.cpp sampler adding `biases` to those tokens' logits. The ids must be below
    `n_vocab`: llama.cpp indexes the logits with them unchecked."""
    ids = sorted(biases)
    array = (llama_cpp.llama_logit_bias * len(ids))(
        *(llama_cpp.llama_logit_bias(token, biases[token]) for token in ids)
    )
    # llama.cpp copies the array, so it need not outlive this call.
    return llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(ids), array)


def token_block(n_vocab: int, tokens: Collection[int]) -> Any:
    """A logit-bias sampler that gives `tokens` a logit of -inf, so no later sampler of
    its chain can pick them (how `ignore_eos`/`min_tokens` keep the output going, as
    llama-server does)."""
    return logit_bias(n_vocab, dict.fromkeys(tokens, -math.inf))


def recommended_sampling(metadata: dict[str, str]) -> dict[str, float]:
    """The sampling a GGUF's `general.sampling.*` metadata recommends (what is present)."""
    out: dict[str, float] = {}
    for name, key in SAMPLING_METADATA.items():
        try:
            out[name] = float(metadata[key])
        except (KeyError, ValueError):
            continue
    return out


@dataclass(frozen=True)
class ChainContext:
    """What a sampler chain needs of its model beyond the request: the defaults for what a
    request leaves unset, and the model's vocabulary and context size (for DRY)."""

    defaults: Mapping[str, float]
    n_vocab: int
    vocab: Any = None
    n_ctx: int = 0
    dry_breakers: Sequence[str] = DRY_SEQUENCE_BREAKERS


def dry_sampler(p: SamplingParams, c: ChainContext) -> Any:
    """llama.cpp's DRY sampler for `p`, or None when its multiplier is 0."""
    d = c.defaults
    multiplier = d.get("dry_multiplier", 0.0) if p.dry_multiplier is None else p.dry_multiplier
    if multiplier <= 0 or c.vocab is None:
        return None
    base = d.get("dry_base", 1.75) if p.dry_base is None else p.dry_base
    allowed = (
        d.get("dry_allowed_length", 2) if p.dry_allowed_length is None else p.dry_allowed_length
    )
    last_n = (
        d.get("dry_penalty_last_n", -1) if p.dry_penalty_last_n is None else p.dry_penalty_last_n
    )
    breakers = c.dry_breakers if p.dry_sequence_breakers is None else p.dry_sequence_breakers
    encoded = [b.encode() for b in breakers]
    array = (ctypes.c_char_p * max(len(encoded), 1))(*encoded)
    return llama_cpp.llama_sampler_init_dry(
        c.vocab,
        float(multiplier),
        float(base),
        int(allowed),
        c.n_ctx if int(last_n) == -1 else int(last_n),
        array,
        len(encoded),
    )


def chain_top(p: SamplingParams, context: ChainContext) -> int | None:
    """How many likeliest tokens `sampler_chain(p, context)` keeps before any sampler that
    reads more than their order (1: greedy), when no sampler before that cut changes a
    logit; None otherwise (penalties, logit bias, DRY, or no top-k)."""
    d = context.defaults
    repeat = d.get("repeat_penalty", 1.0) if p.repeat_penalty is None else p.repeat_penalty
    dry = d.get("dry_multiplier", 0.0) if p.dry_multiplier is None else p.dry_multiplier
    if p.logit_bias or p.presence_penalty or p.frequency_penalty or repeat != 1.0 or dry > 0:
        return None
    temperature = d["temperature"] if p.temperature is None else p.temperature
    if temperature <= 0:
        return 1
    top_k = int(d["top_k"] if p.top_k is None else p.top_k)
    return top_k if top_k > 0 else None


def sampler_chain(
    p: SamplingParams,
    context: ChainContext,
    block: Collection[int] | None = None,
) -> ctypes.c_void_p:
    """A llama.cpp sampler chain for `p`, with the context's defaults for what `p` leaves
    unset. With `block`, the chain starts with a block on those tokens (see `token_block`)."""
    d = context.defaults
    n_vocab = context.n_vocab
    temperature = d["temperature"] if p.temperature is None else p.temperature
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    try:
        add = llama_cpp.llama_sampler_chain_add
        if block is not None:  # first, where the worker's `_lift_eog_block` finds it
            add(chain, token_block(n_vocab, block))
        if p.logit_bias:
            add(chain, logit_bias(n_vocab, p.logit_bias))
        repeat = d.get("repeat_penalty", 1.0) if p.repeat_penalty is None else p.repeat_penalty
        if p.presence_penalty or p.frequency_penalty or repeat != 1.0:
            add(
                chain,
                llama_cpp.llama_sampler_init_penalties(
                    n_vocab,
                    PENALTY_LAST_N,
                    repeat,
                    p.frequency_penalty,
                    p.presence_penalty,
                ),
            )
        if (dry := dry_sampler(p, context)) is not None:
            add(chain, dry)
        if temperature <= 0:
            add(chain, llama_cpp.llama_sampler_init_greedy())
        else:
            seed = p.seed if p.seed is not None else random.getrandbits(32)
            top_k = int(d["top_k"] if p.top_k is None else p.top_k)
            top_p = d["top_p"] if p.top_p is None else p.top_p
            min_p = d["min_p"] if p.min_p is None else p.min_p
            add(chain, llama_cpp.llama_sampler_init_top_k(top_k))
            add(chain, llama_cpp.llama_sampler_init_top_p(top_p, 1))
            add(chain, llama_cpp.llama_sampler_init_min_p(min_p, 1))
            add(chain, llama_cpp.llama_sampler_init_temp(temperature))
            add(chain, llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF))
    except BaseException:
        llama_cpp.llama_sampler_free(chain)
        raise
    return chain
