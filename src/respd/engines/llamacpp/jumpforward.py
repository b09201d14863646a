"""Jump-forward drafts: the text a request's grammar forces next, as tokens to decode at once.

Structured output spends many of its tokens on text the grammar alone decides: the keys of
a schema's object in their order, the quotes, colons and commas between them, the rest of
`true` after its `t`, a forced call's name. Sampled one step at a time, each costs a whole
decode step although nothing was chosen. Here the grammar is walked ahead of the model: from
its state after the token just sampled, character by character, as long as it admits one
character (or one character besides an optional space, where JSON writers' habit decides:
by default a space after `:` and `,` and none elsewhere, then whatever this output did last
after the same character); the text found is tokenized and decoded in the same step as
that token, like a speculative draft.

The draft is then verified as every draft is (see `DecodeWorker._verify`): each position is
sampled from the model's own logits and a draft token is kept only while it equals the
sample. So the output and its logprobs are exactly those of decoding one token a step
(greedy output is the same tokens), whatever the tokenizer would have split differently at
the seams; a draft that guessed wrong costs only its share of the step's compute.

A draft pays only where decoding several tokens in one step costs clearly less per token
than one a step: true of GPUs and of CPUs whose decode waits on memory, not of small CPUs
where the matrix work grows with every token (two cores here: ~12 ms a token at any batch
size, so a draft saves almost nothing and each rejected token costs a whole one). `auto`
therefore measures it once (`batch_cost_ratio`, at the first constrained request) and
drafts only where a token in a step of eight costs at most `PAYING_RATIO` of a step of one.

Finding the text costs a clone of the grammar and one grammar check of a few dozen
one-character tokens per character, microseconds beside a decode step, and inside free text
(a string's value) it stops at the first character.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import llama_cpp

from respd.engines.base import EngineStats
from respd.engines.defaults import JumpForward
from respd.engines.llamacpp.sampler import Candidates

log = logging.getLogger(__name__)

# Characters a JSON grammar's optional `space` may insert; at most one of them besides a
# single other character still counts as a forced run.
SPACE = " "
# After these a JSON writer (and the models trained on their output) puts a space, until
# the output shows its own habit.
SPACE_AFTER = frozenset(":,")
# The longest run walked in one draft, in characters (a draft is bounded in tokens too).
MAX_CHARS = 64
# `auto` drafts where a token of an 8-token step costs at most this share of a 1-token step.
PAYING_RATIO = 0.6
PROBE_TOKENS = 8


def batch_cost_ratio(ctx: Any, batch: Any, seq: int, pos: int, token: int) -> float:
    """What a token costs in a step of `PROBE_TOKENS` tokens of one sequence, as a share of a
    step of one token: decoded into sequence `seq` from position `pos` (context pointer
    `ctx`, a llama_batch of room enough), best of three each, then removed again."""

    def step(n: int) -> float:
        for i in range(n):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos + i, 1
            batch.seq_id[i][0], batch.logits[i] = seq, True
        batch.n_tokens = n
        started = time.perf_counter()
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed while measuring a step's cost")
        return time.perf_counter() - started

    mem = llama_cpp.llama_get_memory(ctx)
    try:
        step(1)  # the first decode of a size sets up buffers: not measured
        one = min(step(1) for _ in range(3))
        many = min(step(PROBE_TOKENS) for _ in range(3))
    finally:
        llama_cpp.llama_memory_seq_rm(mem, seq, pos, -1)
    return many / (PROBE_TOKENS * one) if one > 0 else 1.0


class JumpForwardPolicy:
    """Whether constrained jobs draft their forced text: the `mode` asked for, and for
    `auto` the batching cost measured once (in `stats` as `batch_token_cost_ratio`)."""

    def __init__(
        self,
        mode: JumpForward,
        stats: EngineStats,
        context_window: int,
        n_batch: int,
        decode_turns: threading.Lock,
    ) -> None:
        self.mode = mode
        self.ratio: float | None = None
        self._stats = stats
        self._context_window = context_window
        self._n_batch = n_batch
        self._turns = decode_turns

    @property
    def unmeasured(self) -> bool:
        """Whether `auto` still waits for its measurement."""
        return self.mode == "auto" and self.ratio is None

    @property
    def on(self) -> bool:
        if self.mode == "auto":
            return self.ratio is not None and self.ratio <= PAYING_RATIO
        return self.mode == "on"

    def measure_once(self, ctx: Any, batch: Any, seq: int, pos: int, token: int) -> None:
        """For `auto`, once: measure in sequence `seq` from `pos` (the worker's thread,
        between steps; the cells are cleared again). Where there is no room, later."""
        if self.mode != "auto" or self.ratio is not None:
            return
        if pos + PROBE_TOKENS > self._context_window or self._n_batch < PROBE_TOKENS:
            return
        try:
            with self._turns:  # a step of its own: no other model decodes meanwhile
                self.ratio = batch_cost_ratio(ctx, batch, seq, pos, token)
        except RuntimeError:
            log.warning("could not measure the cost of a step of several tokens")
            self.ratio = 1.0
        self._stats.details["batch_token_cost_ratio"] = round(self.ratio, 3)
        log.info(
            "a token in a step of %d costs %.2f of a step of one: jump-forward %s",
            PROBE_TOKENS,
            self.ratio,
            "on" if self.on else "off",
        )


class ForcedText:
    """Walks a grammar sampler's state ahead to the text it forces, and tokenizes it.

    Built once per model: it holds one token for each printable ASCII character (and
    newline and tab) whose text is exactly that character, the probes the grammar is asked
    about. A vocabulary without such tokens yields no drafts."""

    def __init__(
        self,
        pieces: Callable[[int], bytes],
        tokenize: Callable[[str], Sequence[int]],
        n_vocab: int,
    ) -> None:
        probes: list[tuple[str, int]] = []
        for code in [9, 10, *range(32, 127)]:
            char = chr(code)
            ids = tokenize(char)
            if len(ids) == 1 and 0 <= ids[0] < n_vocab and pieces(ids[0]) == char.encode():
                probes.append((char, int(ids[0])))
        self._chars = [c for c, _ in probes]
        self._ids = [t for _, t in probes]
        self._tokenize = tokenize
        self._probes = Candidates(len(probes))

    def text(self, grammar: Any, spacing: Spacing, max_chars: int = MAX_CHARS) -> str:
        """The text `grammar` (a llama.cpp grammar sampler, left as it is) forces next,
        optional spaces decided by `spacing`."""
        if not self._ids or not grammar:
            return ""
        walker = llama_cpp.llama_sampler_clone(grammar)
        if not walker:
            return ""
        out: list[str] = []
        try:
            while len(out) < max_chars:
                allowed = self._allowed(walker)
                choice = self._choose(allowed, spacing, out[-1] if out else spacing.last)
                if choice is None:
                    break
                llama_cpp.llama_sampler_accept(walker, self._ids[choice])
                out.append(self._chars[choice])
        finally:
            llama_cpp.llama_sampler_free(walker)
        return "".join(out)

    def draft(self, grammar: Any, spacing: Spacing, room: int) -> list[int]:
        """At most `room` tokens of the forced text (none when nothing is forced)."""
        if room <= 0:
            return []
        text = self.text(grammar, spacing)
        if not text:
            return []
        return list(self._tokenize(text))[:room]

    def _allowed(self, walker: Any) -> list[int]:
        """Indices of the probe characters the grammar admits next."""
        for i, token in enumerate(self._ids):
            self._probes.put(i, token)
        self._probes.apply(walker, len(self._ids))
        return [i for i in range(len(self._ids)) if not self._probes.rejected(i)]

    def _choose(self, allowed: list[int], spacing: Spacing, previous: str) -> int | None:
        """The character to walk on: the one admitted, or of a space and one other the
        one `spacing` expects after `previous`; None where the model has a real choice."""
        if len(allowed) == 1:
            return allowed[0]
        if len(allowed) != 2:
            return None
        chars = [self._chars[i] for i in allowed]
        if SPACE not in chars:
            return None
        space = allowed[chars.index(SPACE)]
        other = allowed[1 - chars.index(SPACE)]
        return space if spacing.spaced(previous) else other


class Spacing:
    """One output's habit of putting a space after each character, learnt as it is
    written: what followed the character's latest occurrence."""

    __slots__ = ("_after", "last")

    def __init__(self) -> None:
        self._after: dict[str, bool] = {}
        self.last = ""  # the output's last character so far

    def spaced(self, previous: str) -> bool:
        return self._after.get(previous, previous in SPACE_AFTER)

    def learn(self, text: str) -> None:
        """Take the output's next `text` into account."""
        previous = self.last
        for char in text:
            if previous and previous != SPACE:
                self._after[previous] = char == SPACE
            previous = char
        self.last = previous
