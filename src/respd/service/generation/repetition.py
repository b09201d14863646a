"""A degenerate-repetition stop: the output repeating one span over and over.

Small models fall into loops (the same sentence or two, again and again) that only the
token budget would end. The stop watches the output text and fires once its tail is `count`
copies in a row of one span at least `MIN_SPAN` characters long (a shorter period counts by
its multiples: "ab" repeated is the span "abab…" of 32 characters). So text that repeats
something once — a tool call copying its input, a list whose items share words — is never
cut; only a span written `count` times back to back is.

It works on characters, so it reads every engine alike (a remote one reports no tokens).
For each period p up to `MAX_SPAN` it keeps how many of the last characters equal the one p
before them; a run of r such characters means the last r + p characters have period p.
"""

from __future__ import annotations

import numpy as np

from respd.service.generation.policy import MAX_SPAN, MIN_SPAN


class RepetitionStop:
    """Feed it the output text as it comes; `fired` turns true at the first loop."""

    def __init__(self, repeats: int, *, min_span: int = MIN_SPAN, max_span: int = MAX_SPAN):
        self.repeats = repeats
        self.fired = False
        self._size = max_span
        self._ring = np.full(max_span, -1, dtype=np.int64)  # the last characters' code points
        self._at = 0  # where the next character goes in the ring
        self._back = np.arange(1, max_span + 1)  # period p at index p - 1
        self._run = np.zeros(max_span, dtype=np.int64)
        spans = self._back * -(-min_span // self._back)  # the smallest multiple ≥ min_span
        self._needed = repeats * spans - self._back

    def feed(self, text: str) -> bool:
        """Read more output; true once it has looped (and from then on)."""
        if self.fired or self.repeats < 2:
            return self.fired
        for char in text:
            code = ord(char)
            before = self._ring[(self._at - self._back) % self._size]
            self._run = np.where(before == code, self._run + 1, 0)
            self._ring[self._at] = code
            self._at = (self._at + 1) % self._size
        self.fired = bool(np.any(self._run >= self._needed))
        return self.fired
