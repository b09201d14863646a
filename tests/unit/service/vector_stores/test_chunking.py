"""Chunking strategies and the chunker: sizes in approximate tokens, overlap, limits."""

from __future__ import annotations

import pytest

from respd.protocol.errors import InvalidRequest
from respd.service.vector_stores.chunking import approx_tokens, check_strategy, chunk_text


def _static(max_tokens: object, overlap: object) -> dict[str, object]:
    return {
        "type": "static",
        "static": {"max_chunk_size_tokens": max_tokens, "chunk_overlap_tokens": overlap},
    }


def test_auto_and_absent_are_800_tokens_with_400_overlap() -> None:
    assert check_strategy(None) == check_strategy({"type": "auto"}) == _static(800, 400)
    assert check_strategy(_static(100, 50)) == _static(100, 50)
    assert check_strategy(_static(4096, 0)) == _static(4096, 0)


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (_static(99, 0), "chunking_strategy.static.max_chunk_size_tokens"),
        (_static(4097, 0), "chunking_strategy.static.max_chunk_size_tokens"),
        (_static(200, 101), "chunking_strategy.static.chunk_overlap_tokens"),
        (_static(200, -1), "chunking_strategy.static.chunk_overlap_tokens"),
        (_static("200", 0), "chunking_strategy.static.max_chunk_size_tokens"),
        (_static(200, True), "chunking_strategy.static.chunk_overlap_tokens"),
        ({"type": "static"}, "chunking_strategy.static"),
        ({"type": "other"}, "chunking_strategy.type"),
        ("auto", "chunking_strategy"),
    ],
)
def test_bad_strategies_name_their_field(raw: object, param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_strategy(raw)
    assert caught.value.param == param


def test_chunks_hold_at_most_max_tokens_and_overlap() -> None:
    words = [f"w{i:03d}" for i in range(1000)]  # one token each
    chunks = chunk_text(" ".join(words), 100, 30)
    assert all(sum(approx_tokens(w) for w in c.split()) <= 100 for c in chunks)
    first, second = chunks[0].split(), chunks[1].split()
    assert first == words[:100]
    assert second[:30] == words[70:100]  # the next chunk starts 30 tokens back
    assert chunks[-1].split()[-1] == "w999"
    rebuilt = {w for c in chunks for w in c.split()}
    assert rebuilt == set(words)


def test_no_overlap_partitions_the_text_and_keeps_inner_whitespace() -> None:
    text = "alpha beta\ngamma  delta " * 60
    chunks = chunk_text(text, 100, 0)
    assert " ".join(c for c in chunks).split() == text.split()
    assert "beta\ngamma  delta" in chunks[0]


def test_a_word_longer_than_a_chunk_is_cut() -> None:
    chunks = chunk_text("x" * 1000, 100, 0)
    assert [len(c) for c in chunks] == [400, 400, 200]


def test_empty_text_has_no_chunks() -> None:
    assert chunk_text("", 100, 0) == [] and chunk_text(" \n ", 100, 50) == []
