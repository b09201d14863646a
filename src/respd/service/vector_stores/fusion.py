"""Ranking: exact cosine similarity over stored float32 vectors, and reciprocal rank fusion
of several rankings (full-text and vector, per query) into one score in [0, 1]."""

from __future__ import annotations

import numpy as np

RRF_K = 60  # the constant of Cormack et al.'s reciprocal rank fusion


def pack(vector: list[float]) -> bytes:
    """A vector as little-endian float32 bytes, as the stores keep it."""
    return np.asarray(vector, dtype="<f4").tobytes()


def cosine_ranking(rows: list[tuple[int, bytes]], query: list[float], limit: int) -> list[int]:
    """The ids of the `limit` rows most similar to `query`, best first; rows whose width
    differs from the query's (made by another model) are skipped. CPU work: run it in a
    thread."""
    q = np.asarray(query, dtype=np.float32)
    norm = float(np.linalg.norm(q))
    if not rows or norm == 0:
        return []
    width = q.shape[0] * 4
    kept = [(i, blob) for i, blob in rows if len(blob) == width]
    if not kept:
        return []
    ids = np.fromiter((i for i, _ in kept), dtype=np.int64, count=len(kept))
    matrix = np.frombuffer(b"".join(blob for _, blob in kept), dtype="<f4").reshape(len(kept), -1)
    norms = np.linalg.norm(matrix, axis=1)
    norms[norms == 0] = 1.0
    scores = matrix @ q / (norms * norm)
    order = np.lexsort((ids, -scores))[:limit]
    return [int(ids[i]) for i in order]


def fuse(rankings: list[list[int]], k: int = RRF_K) -> dict[int, float]:
    """Reciprocal rank fusion: each id scores the sum of 1 / (k + rank) over the rankings
    it is in, divided by what an id ranked first in all of them would score, so that the
    score lies in [0, 1]."""
    if not rankings:
        return {}
    best = len(rankings) / (k + 1)
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, chunk_id in enumerate(ranking, start=1):
            scores[chunk_id] = scores.get(chunk_id, 0.0) + 1.0 / (k + rank)
    return {chunk_id: min(1.0, score / best) for chunk_id, score in scores.items()}
