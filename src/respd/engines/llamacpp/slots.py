"""Sequence slots and prefix reuse: pure bookkeeping, no llama.cpp calls.

Each slot is one llama.cpp sequence id. A slot remembers the tokens its sequence holds in
the KV cache after its request ends, so the next request that starts with the same tokens
(a `previous_response_id` turn, a conversation, a shared `instructions` block) skips that
prefill. A prefix held by *any* slot can be shared into the slot a new request gets
(its KV stream is copied).
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


def place(
    slots: list[Slot],
    prompt: Sequence[int],
    cache_key: str | None = None,
    spans: Sequence[tuple[int, int]] = (),
) -> Placement | None:
    """Choose a free slot for `prompt` and the longest reusable prefix anywhere.

    At least the last prompt token is always decoded again, so the first sample comes
    from fresh logits. A `prompt_cache_key` steers toward the slot that last served it.
    `spans` are the prompt's image spans `(start, length)`, which are reused whole or not
    at all.
    """
    free = [s for s in slots if s.free]
    if not free:
        return None
    limit = max(len(prompt) - 1, 0)

    def own(s: Slot) -> int:
        return clamp_to_spans(min(common_prefix(s.tokens, prompt), limit), spans)

    keyed = [s for s in free if cache_key is not None and s.cache_key == cache_key]
    # Prefer a free slot whose own cache matches best; among equals, the keyed one,
    # then the least recently used (its cache is the least likely to be wanted).
    target = max(free, key=lambda s: (own(s), s in keyed, -s.last_used))
    best_src = max(slots, key=own)
    if own(best_src) > own(target) and best_src is not target:
        return Placement(target, own(best_src), best_src)
    return Placement(target, own(target), None)
