"""Prompt-lookup drafts: guess the next tokens from where the latest ones appeared before.

Output often repeats its input (an edited file, a quoted passage, code echoing names): when
the last few tokens occurred earlier in the prompt or the output, the tokens that followed
them then are a likely continuation now. The engine decodes such a draft together with the
next token and keeps the part its sampler agrees with (see `engine.py`); a wrong draft costs
only the larger batch. Pure bookkeeping, no llama.cpp calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class NgramSpeculation:
    """How drafts are made: the longest n-gram first, down to `ngram_min` tokens; at most
    `draft_max` tokens per draft."""

    draft_max: int
    ngram_min: int
    ngram_max: int

    def __post_init__(self) -> None:
        if self.draft_max < 1 or not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"invalid n-gram speculation settings: {self}")


class NgramLookup:
    """A token history with an index of every n-gram (n in [ngram_min, ngram_max]) to the
    position just past its latest occurrence.

    The n-grams ending at the very end of the history are kept out of the index until the
    next token comes, so a lookup of the current suffix finds its latest *earlier*
    occurrence. Appending a token costs one dict store per n; a proposal one lookup per n.
    """

    def __init__(self, settings: NgramSpeculation, tokens: Iterable[int] = ()) -> None:
        self.settings = settings
        self.tokens: list[int] = []
        # How long the next draft may be (see `feedback`): one token until drafts prove
        # right, since on text that does not copy most would be wasted decode rows.
        self.size = 1
        self._after: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, token: int) -> None:
        toks = self.tokens
        end = len(toks)
        # The suffixes that were held back become indexable now that a token follows them.
        for n in range(self.settings.ngram_min, min(self.settings.ngram_max, end) + 1):
            self._after[tuple(toks[end - n :])] = end
        toks.append(token)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.append(token)

    def feedback(self, drafted: int, accepted: int) -> None:
        """Adapt the draft length to how well drafts fare: twice as long after one was
        taken whole (up to `draft_max`), as long as the part taken (at least 1) after a
        miss. Every draft token costs a decode row whether it is taken or not, so text that
        only happens to repeat a few tokens gets short drafts, and copying long ones."""
        if accepted >= drafted:
            self.size = min(self.settings.draft_max, 2 * self.size)
        else:
            self.size = max(1, accepted)

    def propose(self, limit: int | None = None) -> list[int]:
        """The tokens that followed the latest earlier occurrence of the longest suffix
        found (at most the current `size`, or `limit` when smaller); [] when none recurs.
        A draft stops before a negative id (an image placeholder is never text to decode)."""
        n_max = self.size if limit is None else min(limit, self.size)
        if n_max <= 0:
            return []
        toks = self.tokens
        end = len(toks)
        for n in range(min(self.settings.ngram_max, end), self.settings.ngram_min - 1, -1):
            start = self._after.get(tuple(toks[end - n :]))
            if start is None:
                continue
            draft = toks[start : start + n_max]
            for i, token in enumerate(draft):
                if token < 0:
                    return draft[:i]
            return draft
        return []
