"""Closing a grammar-constrained output before its token limit cuts it.

A structured answer cut by `max_output_tokens` inside a string that ran on is JSON no
client can parse. So near its limit a constrained job estimates how many tokens would close
its value from where the grammar stands: it replays the grammar, without the model, choosing
each step the allowed token that closes most (a quote or bracket before a comma or colon,
anything before bare whitespace) and then the longest, from a small alphabet: the vocabulary's
one-character tokens, its closers, and the tokens that spell the grammar's own literals (its
keys and enum values). Once the tokens left come within that estimate, the worker samples
with `GrammarCheckedSampler.sample_closing`: the most closing token the model ranks highest.

The estimate stops at `CLOSING_MAX` steps: a grammar it cannot close by then (a thinking
block still open, a schema with many required properties) is left to the limit, as before.
Only answers close early: a tool call closed with made-up arguments would look whole to a
client that runs it, so a call the limit cuts stays cut (and `incomplete`).
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np

from respd.engines.llamacpp.jumpforward import ForcedText, Spacing
from respd.engines.llamacpp.sampler import GrammarCheckedSampler

CLOSERS = frozenset('"}]')
SEPARATORS = frozenset(",:")
CLOSING_MAX = 64  # tokens before the limit where estimating starts, and the estimate's cap
# GBNF string literals ("\"width\""), whose text the alphabet spells in the model's tokens.
_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t"}


@dataclass(frozen=True)
class ClosingVocab:
    """What closing needs of a vocabulary, computed once per model."""

    preference: np.ndarray  # per token: how much it closes (`_preference`)
    lengths: np.ndarray  # per token: its text's length in bytes
    alphabet: np.ndarray  # ids: the one-character tokens and the closing ones
    eog: int  # an end-of-generation token: allowed once the grammar's value is complete
    closers: np.ndarray  # ids: every token that closes anything (positive preference)

    @classmethod
    def of(cls, pieces: Sequence[bytes], eog: int) -> ClosingVocab:
        preference = np.zeros(len(pieces), dtype=np.int8)
        lengths = np.zeros(len(pieces), dtype=np.int32)
        alphabet = [eog]
        for token, piece in enumerate(pieces):
            text = piece.decode("utf-8", errors="ignore")
            lengths[token] = len(piece)
            preference[token] = _preference(text)
            if len(text) == 1 or preference[token] > 0:
                alphabet.append(token)
        return cls(preference, lengths, np.unique(alphabet), eog, np.flatnonzero(preference > 0))


def _preference(text: str) -> int:
    """How much a token's text closes: closers alone rank above closers with separators;
    within each, one starting with a quote first (inside a string only a quote closes, and
    brackets are text), and one without whitespace before one with it (the grammar's
    optional spaces cost tokens). Whitespace alone ranks last, below any other text."""
    core = text.strip()
    if not core:
        return -1 if text else 0
    if set(core) <= CLOSERS:
        rank = 4
    elif set(core) <= CLOSERS | SEPARATORS:
        rank = 2
    else:
        return 0
    return 2 * (rank + core.startswith('"')) - (core != text)


def grammar_literals(grammar: str) -> list[str]:
    """The texts of a GBNF grammar's string literals."""

    def unescape(body: str) -> str:
        return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m[1], m[1]), body)

    return [unescape(m[1]) for m in _LITERAL.finditer(grammar)]


class _Tight(Spacing):
    """No optional space: a closing answer spends no token on one."""

    __slots__ = ()

    def spaced(self, previous: str) -> bool:
        return False


_TIGHT = _Tight()  # stateless: one serves every closing step


class Closer:
    """One job's closing estimate; `due` says when to start closing (and stays true), and
    `sample` picks each closing token. `forced`: the walk to the text the grammar forces,
    which closing spells in the fewest tokens (the model, token by token, may take more)."""

    def __init__(
        self,
        vocab: ClosingVocab,
        grammar: str,
        tokenize: Callable[[str], list[int]],
        forced: ForcedText | None = None,
    ) -> None:
        self._tokenize = tokenize
        self._forced = forced
        spellings = {s for text in set(grammar_literals(grammar)) for s in (text, " " + text)}
        spelled = {t for text in spellings for t in tokenize(text)}
        self._vocab = vocab
        self._ids = np.union1d(vocab.alphabet, np.fromiter(spelled, dtype=np.int64))
        self._ids = self._ids[self._ids < len(vocab.preference)]
        self._data = np.zeros(
            len(self._ids),
            dtype=np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True),
        )
        self._array = llama_cpp.llama_token_data_array(
            data=self._data.ctypes.data_as(llama_cpp.llama_token_data_p),
            size=len(self._ids),
            selected=-1,
            sorted=False,
        )
        # Ranked once: the most closing first, then the longest (fewest tokens).
        rank = np.lexsort((-vocab.lengths[self._ids], -vocab.preference[self._ids]))
        self._order = np.empty_like(rank)
        self._order[rank] = np.arange(len(rank))
        self.closing = False

    def due(self, sampler: GrammarCheckedSampler, left: int) -> bool:
        """Whether a job with `left` tokens before its limit should close now."""
        if not self.closing and left <= CLOSING_MAX:
            need = self.need(sampler.grammar)
            self.closing = need is not None and left <= need + 4 + need // 2
        return self.closing

    def sample(self, sampler: GrammarCheckedSampler, ctx: Any, idx: int) -> tuple[int, bool]:
        """The next closing token at batch index `idx`, and whether the budget rather than
        the model chose it: the first token of the text the grammar forces from here (a key
        and its punctuation; the model had no other text to write), else the allowed token
        that closes most (`GrammarCheckedSampler.sample_closing`)."""
        # Whitespace is never taken as forced: the walk reads only printable characters, so
        # a lone space it finds may stand beside an end of generation it cannot see.
        text = self._forced.text(sampler.grammar, _TIGHT).strip() if self._forced else ""
        if text and sampler.take(token := self._tokenize(text)[0]):
            return token, False
        vocab = self._vocab
        return sampler.sample_closing(ctx, idx, vocab.preference, vocab.closers)

    def close_now(self, sampler: GrammarCheckedSampler) -> bool:
        """Start closing now, whatever the tokens left; false when the value cannot be
        closed within `CLOSING_MAX` tokens."""
        if not self.closing:
            self.closing = self.need(sampler.grammar) is not None
        return self.closing

    def need(self, grammar: Any) -> int | None:
        """Tokens that close the grammar's value from its state, or None past the cap."""
        replay = llama_cpp.llama_sampler_clone(grammar)
        try:
            for step in range(CLOSING_MAX + 1):
                self._data["id"] = self._ids
                self._data["logit"] = 0.0
                self._array.size = len(self._ids)
                self._array.selected = -1
                self._array.sorted = False
                llama_cpp.llama_sampler_apply(replay, ctypes.byref(self._array))
                allowed = np.isfinite(self._data["logit"])
                if not allowed.any():
                    return None
                if allowed[np.searchsorted(self._ids, self._vocab.eog)]:
                    return step
                best = np.argmin(np.where(allowed, self._order, len(self._order)))
                llama_cpp.llama_sampler_accept(replay, int(self._ids[best]))
            return None
        finally:
            llama_cpp.llama_sampler_free(replay)
