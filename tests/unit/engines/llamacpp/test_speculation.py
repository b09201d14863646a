"""Prompt-lookup drafts: what is proposed, from which occurrence, within which limits, and
that the incremental index agrees with a plain scan of the history."""

from __future__ import annotations

import random

import pytest

from respd.engines.llamacpp.speculation import NgramLookup, NgramSpeculation


def lookup(tokens: list[int], draft_max: int = 4, ngram: tuple[int, int] = (1, 3)) -> NgramLookup:
    """A lookup whose drafts have grown to `draft_max` (as after drafts taken whole)."""
    lk = NgramLookup(NgramSpeculation(draft_max, *ngram), tokens)
    lk.size = draft_max
    return lk


def scan(tokens: list[int], s: NgramSpeculation, limit: int) -> list[int]:
    """The proposal by brute force: longest suffix first, its latest earlier occurrence."""
    end = len(tokens)
    for n in range(min(s.ngram_max, end - 1), s.ngram_min - 1, -1):
        suffix = tokens[end - n :]
        for start in range(end - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                draft = tokens[start + n : start + n + min(limit, s.draft_max)]
                cut = next((i for i, t in enumerate(draft) if t < 0), len(draft))
                return draft[:cut]
    return []


def test_proposes_what_followed_the_suffix_before() -> None:
    # ... 1 2 3 [4 5 6 7 8] ... 1 2 3 -> 4 5 6 7
    assert lookup([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]).propose() == [4, 5, 6, 7]


def test_nothing_recurs_nothing_proposed() -> None:
    assert lookup([1, 2, 3, 4, 5]).propose() == []
    assert lookup([]).propose() == []
    assert lookup([7]).propose() == []


def test_the_longest_ngram_wins_over_a_more_recent_shorter_one() -> None:
    # The suffix (1, 2, 3) occurred at the start, followed by 10; (3,) alone occurred last
    # followed by 20. The 3-gram match is the better guess.
    tokens = [1, 2, 3, 10, 11, 5, 3, 20, 21, 1, 2, 3]
    assert lookup(tokens, draft_max=2).propose() == [10, 11]
    # With 1-grams only, the latest earlier 3 (the one before 20) is the match.
    assert lookup(tokens, draft_max=2, ngram=(1, 1)).propose() == [20, 21]


def test_the_latest_earlier_occurrence_is_used() -> None:
    tokens = [5, 6, 1, 5, 6, 2, 5, 6]
    assert lookup(tokens, draft_max=1, ngram=(2, 2)).propose() == [2]


def test_ngram_min_bounds_what_counts_as_a_match() -> None:
    tokens = [1, 9, 9, 2, 1]  # only the 1-gram (1,) recurs
    assert lookup(tokens, ngram=(1, 3)).propose() == [9, 9, 2, 1]
    assert lookup(tokens, ngram=(2, 3)).propose() == []


def test_limits_cut_the_draft() -> None:
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert lookup(tokens, draft_max=3).propose() == [3, 4, 5]
    assert lookup(tokens, draft_max=3).propose(2) == [3, 4]
    assert lookup(tokens, draft_max=3).propose(10) == [3, 4, 5]
    assert lookup(tokens, draft_max=3).propose(0) == []
    assert lookup(tokens, draft_max=3).propose(-1) == []


def test_a_recent_match_proposes_only_what_follows_it() -> None:
    # The suffix (7,) last occurred one token before the end: only the 7 after it follows.
    assert lookup([7, 7], draft_max=5).propose() == [7]


def test_a_draft_stops_before_an_image_placeholder() -> None:
    tokens = [1, 2, 3, -40, -41, 5, 1, 2]
    assert lookup(tokens).propose() == [3]
    assert lookup([1, 2, -40, 1, 2]).propose() == []


def test_appending_updates_the_index_incrementally() -> None:
    lk = lookup([1, 2, 3, 4], draft_max=2)
    assert lk.propose() == []
    lk.append(1)
    assert lk.propose() == [2, 3]
    lk.extend([2, 3])
    assert lk.propose() == [4, 1]
    lk.append(8)  # (3, 8) never occurred; (8,) neither
    assert lk.propose() == []
    assert len(lk) == 8 and lk.tokens == [1, 2, 3, 4, 1, 2, 3, 8]


@pytest.mark.parametrize("seed", range(20))
def test_the_index_agrees_with_a_scan_at_every_length(seed: int) -> None:
    rng = random.Random(seed)
    settings = NgramSpeculation(rng.randint(1, 6), rng.randint(1, 2), rng.randint(2, 4))
    lk = NgramLookup(settings)
    lk.size = settings.draft_max
    history: list[int] = []
    for _ in range(300):
        # A small alphabet (with an occasional placeholder) so n-grams recur often.
        token = rng.choice([*range(6), -1])
        history.append(token)
        lk.append(token)
        limit = rng.randint(0, 8)
        assert lk.propose(limit) == scan(history, settings, limit), (history, limit)


def test_draft_length_adapts_to_how_drafts_fare() -> None:
    tokens = list(range(20)) + list(range(10))  # the suffix recurs, 10 tokens follow it
    lk = NgramLookup(NgramSpeculation(8, 1, 3), tokens)
    assert lk.propose() == [10]  # one token until drafts prove right
    sizes = []
    for _ in range(4):
        lk.feedback(drafted=lk.size, accepted=lk.size)
        sizes.append(lk.size)
    assert sizes == [2, 4, 8, 8]  # doubling while taken whole, up to draft_max
    assert lk.propose() == [10, 11, 12, 13, 14, 15, 16, 17]
    assert lk.propose(3) == [10, 11, 12]
    lk.feedback(drafted=8, accepted=3)
    assert lk.size == 3  # a miss: as long as the part taken
    lk.feedback(drafted=3, accepted=0)
    assert lk.size == 1  # never below one token
    # A draft cut short (by the limit or the history's end) and taken whole still grows it.
    lk.feedback(drafted=1, accepted=1)
    assert lk.size == 2


@pytest.mark.parametrize(
    ("draft_max", "ngram_min", "ngram_max"), [(0, 1, 3), (4, 0, 3), (4, 3, 2), (-1, 1, 1)]
)
def test_invalid_settings_are_refused(draft_max: int, ngram_min: int, ngram_max: int) -> None:
    with pytest.raises(ValueError):
        NgramSpeculation(draft_max, ngram_min, ngram_max)
