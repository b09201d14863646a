"""How far a generation may run when its request does not bound it.

A small model can loop, or ramble on, until its context window is full: thousands of tokens
and minutes of a slot for nothing. Two bounds stop that without cutting a real answer: a
default output cap per model (a request's own limit still wins, up to the context), and the
repetition stop (see `repetition.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

CONTEXT_SHARE = 4  # the default cap is this fraction of a model's context window
# The repetition stop: `REPEATS` copies in a row of one span of `MIN_SPAN` to `MAX_SPAN`
# characters end a turn.
MIN_SPAN = 32  # shorter spans written again and again are rules, tables, lists
MAX_SPAN = 512  # the longest loop looked for (a few sentences)
REPEATS = 4


@dataclass(frozen=True)
class OutputPolicy:
    # The cap when a request sets none: None for a quarter of the model's context
    # window, 0 for none (the context window alone ends the output).
    max_tokens: int | None = None
    repetition_stop: int = REPEATS  # copies in a row of one span that end a turn; 0: never

    def cap(self, context_window: int | None) -> int | None:
        """The output cap of a model with this context window (None: no cap)."""
        if self.max_tokens is not None:
            return self.max_tokens or None
        return max(1, context_window // CONTEXT_SHARE) if context_window else None
