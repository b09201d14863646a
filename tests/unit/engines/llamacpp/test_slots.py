"""Slot placement and prefix reuse (pure bookkeeping, no model)."""

from __future__ import annotations

from respd.engines.llamacpp.slots import (
    CONTINUE_SLACK,
    COPY_CELLS_PER_TOKEN,
    Slot,
    clamp_to_spans,
    common_prefix,
    place,
)


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_reuses_own_prefix_but_always_redecodes_the_last_token() -> None:
    slots = [Slot(0, tokens=[1, 2, 3, 4]), Slot(1)]
    p = place(slots, [1, 2, 3, 4])
    assert p is not None and p.slot.seq_id == 0 and p.copy_from is None
    assert p.reuse == 3  # the last prompt token is decoded again for fresh logits


def test_copies_a_prefix_held_by_a_busy_slot() -> None:
    busy = Slot(0, tokens=[5, 6, 7, 8, 9], job=object())
    free = Slot(1, tokens=[1, 2])
    p = place([busy, free], [5, 6, 7, 8, 10, 11])
    assert p is not None
    assert p.slot is free and p.copy_from is busy and p.reuse == 4


def test_prefers_longest_match_then_key_then_lru() -> None:
    a = Slot(0, tokens=[1, 9], last_used=5)
    b = Slot(1, tokens=[1, 9], cache_key="k", last_used=9)
    c = Slot(2, tokens=[], last_used=1)
    assert place([a, b, c], [1, 9, 9, 9], cache_key="k").slot is b  # type: ignore[union-attr]
    assert place([a, b, c], [1, 9, 9, 9]).slot is a  # type: ignore[union-attr]
    assert place([a, b, c], [7, 7]).slot is c  # type: ignore[union-attr]


def test_a_shared_prefix_is_copied_rather_than_overwriting_another_history() -> None:
    history = [1, 2, 3, *range(100, 120)]  # a system prompt, then its own turns
    a = Slot(0, tokens=history, last_used=9)
    empty = Slot(1, last_used=1)
    p = place([a, empty], [1, 2, 3, 50, 51])
    assert p is not None
    assert p.slot is empty and p.copy_from is a and p.reuse == 3
    # The same conversation's next turn continues its own slot.
    p = place([a, empty], [*history, 60, 61])
    assert p is not None and p.slot is a and p.copy_from is None and p.reuse == len(history)
    # So does one that drops no more than the slack from the slot's end.
    p = place([a, empty], [*history[:-CONTINUE_SLACK], 60])
    assert p is not None and p.slot is a
    # A repeat of the slot's whole prompt replaces only its answer.
    answered = Slot(0, tokens=[*history, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], prompt_len=23)
    p = place([answered, empty], history)
    assert p is not None and p.slot is answered and p.reuse == len(history) - 1
    # With every free slot holding another history, the least recently used one goes.
    b = Slot(1, tokens=[1, 2, 3, *range(200, 220)], last_used=3)
    p = place([a, b], [1, 2, 3, 50, 51])
    assert p is not None and p.slot is b and p.reuse == 3 and p.copy_from is None


def test_no_free_slot() -> None:
    assert place([Slot(0, job=object())], [1, 2]) is None


def test_a_reused_prefix_never_ends_inside_an_image_span() -> None:
    assert clamp_to_spans(5, [(3, 4)]) == 3  # inside [3, 7): back to the span start
    assert clamp_to_spans(7, [(3, 4)]) == 7  # the whole image matched
    assert clamp_to_spans(3, [(3, 4)]) == 3
    # Same text, then the same first image position by chance but another image: the
    # placeholders diverge inside the span, so nothing of the image is reused.
    slot = Slot(0, tokens=[1, 2, -5, -6, -7, -8, 3])
    p = place([slot], [1, 2, -5, -6, -9, -9, 3, 4], spans=[(2, 4)])
    assert p is not None and p.reuse == 2
    # An image that is the prompt's last span is reused whole when all of it matches.
    p = place([slot], [1, 2, -5, -6, -7, -8, 3, 4], spans=[(2, 4)])
    assert p is not None and p.reuse == 7


def test_a_short_prefix_of_a_long_history_is_decoded_rather_than_copied() -> None:
    system = [1, 2, 3, 4]
    long = Slot(0, tokens=[*system, *range(100, 100 + 4 * COPY_CELLS_PER_TOKEN)])
    empty = Slot(1)
    p = place([long, empty], [*system, 50])
    # Copying every cell of the long history would cost more than prefilling 4 tokens.
    assert p is not None and p.slot is empty and p.copy_from is None and p.reuse == 0
    short = Slot(0, tokens=[*system, *range(100, 100 + 3 * COPY_CELLS_PER_TOKEN)])
    p = place([short, empty], [*system, 50])
    assert p is not None and p.copy_from is short and p.reuse == len(system)
