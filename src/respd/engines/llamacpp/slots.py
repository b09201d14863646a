"""Sequence slots and prefix reuse: pure bookkeeping, no llama.cpp calls.

Each slot is one llama.cpp sequence id. A slot remembers the tokens its sequence holds in
the KV cache after its request ends, so the next request that starts with the same tokens
(a `previous_response_id` turn, a conversation, a shared `instructions` block) skips that
prefill. A prefix held by *any* slot can be shared into the slot a new request gets
(its KV cells are copied).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # what the KV cache holds for this seq
    job: Any = None  # the request running here, or None when free
    cache_key: str | None = None  # prompt_cache_key of the last request served here
    retain: bool = False  # that request asked its KV be kept longest
    prompt_len: int = 0  # how many of `tokens` were that request's prompt
    last_used: int = 0

    @property
    def free(self) -> bool:
        return self.job is None


@dataclass(frozen=True)
class Placement:
    """Where a new request runs and which cached prefix it starts from."""

    slot: Slot
    reuse: int  # prompt tokens already in the KV cache after placement
    copy_from: Slot | None  # share [0, reuse) from this slot's sequence first


def clamp_to_spans(n: int, spans: Sequence[tuple[int, int]]) -> int:
    """`n` moved back to the start of any span `(start, length)` it falls inside: an image is
    decoded whole or not at all, so a reused prefix never ends inside one."""
    for start, length in spans:
        if start < n < start + length:
            return start
    return n


# A prefix is copied from another slot only when it saves at least one token of prefill
# per this many cells copied (a copy moves every cell the source holds). On the 135M
# default a prefilled token costs about as much as copying 35 cells; larger models
# prefill relatively slower, so copies pay off sooner there.
COPY_CELLS_PER_TOKEN = 32

# Tokens a request may drop from the end of a slot's cache and still count as continuing
# it: the previous turn's last token or two, which the rendered history can spell otherwise.
CONTINUE_SLACK = 8


def place(
    slots: list[Slot],
    prompt: Sequence[int],
    cache_key: str | None = None,
    spans: Sequence[tuple[int, int]] = (),
) -> Placement | None:
    """Choose a free slot for `prompt` and the longest reusable prefix anywhere.

    At least the last prompt token is always decoded again, so the first sample comes
    from fresh logits. `spans` are the prompt's image spans `(start, length)`, which are
    reused whole or not at all.

    The request goes to a slot whose cache it continues (an empty one, one whose tokens
    it repeats but for `CONTINUE_SLACK` at the end, or one whose whole prompt it repeats,
    replacing only the answer), the best-matching first; only when there is none does it
    overwrite another's cache, the least recently used.
    Either way it starts from the longest prefix any slot holds, copied in when that is
    another slot's and saves enough to pay for the copy: a new conversation that shares
    only a system prompt with a slot takes that prefix without destroying the slot's own
    history. Among equals, a `prompt_cache_key` steers toward the slot that last served
    it.
    """
    free = [s for s in slots if s.free]
    if not free:
        return None
    limit = max(len(prompt) - 1, 0)

    # Each slot's own reusable prefix, once: comparing token lists is the costly part.
    own = {
        s.seq_id: clamp_to_spans(min(common_prefix(s.tokens, prompt), limit), spans) for s in slots
    }

    def rank(s: Slot) -> tuple[bool, int, bool, int]:
        mine = own[s.seq_id]
        continues = len(s.tokens) - mine <= CONTINUE_SLACK or mine >= s.prompt_len - 1 > 0
        keyed = cache_key is not None and s.cache_key == cache_key
        return continues, mine if continues else 0, keyed, -s.last_used

    target = max(free, key=rank)
    best_src = max(slots, key=lambda s: own[s.seq_id])
    gain = own[best_src.seq_id] - own[target.seq_id]
    if gain > 0 and gain * COPY_CELLS_PER_TOKEN >= len(best_src.tokens):
        return Placement(target, own[best_src.seq_id], best_src)
    return Placement(target, own[target.seq_id], None)
