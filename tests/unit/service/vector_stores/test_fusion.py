"""Cosine ranking over packed vectors, and reciprocal rank fusion's scores."""

from __future__ import annotations

import math

from respd.service.vector_stores.fusion import RRF_K, cosine_ranking, fuse, pack


def test_cosine_ranking_orders_by_similarity_and_skips_other_widths() -> None:
    rows = [
        (1, pack([1.0, 0.0, 0.0])),
        (2, pack([0.6, 0.8, 0.0])),
        (3, pack([0.0, 0.0, 1.0])),
        (4, pack([1.0, 0.0])),  # another model's width
        (5, pack([0.0, 0.0, 0.0])),
    ]
    assert cosine_ranking(rows, [0.9, 0.1, 0.0], 10) == [1, 2, 3, 5]  # ties: by id
    assert cosine_ranking(rows, [0.0, 0.0, 2.0], 1) == [3]
    assert 4 not in cosine_ranking(rows, [1.0, 0.0, 0.0], 10)
    assert cosine_ranking([], [1.0], 3) == [] and cosine_ranking(rows, [0.0, 0.0, 0.0], 3) == []


def test_fusion_scores_lie_in_0_1_and_reward_agreement() -> None:
    scores = fuse([[1, 2, 3], [2, 1, 4]])
    assert math.isclose(
        max(scores.values()), (1 / (RRF_K + 1) + 1 / (RRF_K + 2)) / (2 / (RRF_K + 1))
    )
    assert scores[1] == scores[2] > scores[3] > 0
    assert scores[3] < 0.5 and scores[4] < 0.5  # found by one ranking of two
    assert fuse([[7]]) == {7: 1.0}
    assert fuse([]) == {}
