"""Hybrid search over the chunks of chosen files: per query string, the store's full-text
ranking (FTS5 BM25, PostgreSQL `ts_rank_cd`, or BM25 in Python) and, with an embedding
model, an exact cosine ranking (in the database where the store can, else in numpy); all
fused by reciprocal rank fusion."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from respd.engines.embedding import Embedder
from respd.service.vector_stores.fusion import cosine_ranking, fuse
from respd.service.vector_stores.ingest import embed_texts
from respd.store.base import Store
from respd.store.vectors.records import ChunkHit, query_terms

log = logging.getLogger(__name__)

MIN_CANDIDATES = 50  # chunks each ranking contributes, at least


@dataclass(frozen=True)
class ScoredChunk:
    chunk: ChunkHit
    score: float


async def _query_vectors(embedder: Embedder, queries: list[str]) -> list[list[float]]:
    """The queries' vectors; none (full-text only) when the embedder fails, so that search
    still answers."""
    try:
        return await embed_texts(embedder, queries)
    except Exception:
        log.warning("embedding a search query failed; searching full-text only", exc_info=True)
        return []


async def _vector_rankings(
    store: Store, keys: list[str], vectors: list[list[float]], limit: int
) -> list[list[int]]:
    """One cosine ranking per query vector: the store's own when it can rank in the
    database, else numpy's over the files' vectors, read once for all the vectors. A ranking
    that finds nothing (no chunk of the query's width) is left out, so that it does not
    halve the scores of what the words found."""
    rankings: list[list[int]] = []
    rows: list[tuple[int, bytes]] | None = None
    for vector in vectors:
        ranking = await store.nearest_chunks(keys, vector, limit)
        if ranking is None:
            if rows is None:
                rows = await store.chunk_vectors(keys)
            ranking = await asyncio.to_thread(cosine_ranking, rows, vector, limit) if rows else []
        if ranking:
            rankings.append(ranking)
    return rankings


async def hybrid_search(
    store: Store,
    embedder: Embedder | None,
    keys: list[str],
    queries: list[str],
    limit: int,
) -> list[ScoredChunk]:
    """The best `limit` chunks of the files `keys` names for `queries`, best first, each
    with its fused score in [0, 1]."""
    if not keys:
        return []
    candidates = max(MIN_CANDIDATES, 4 * limit)
    rankings: list[list[int]] = []
    found: dict[int, ChunkHit] = {}
    for query in queries:
        hits = await store.lexical_chunks(keys, query_terms(query), candidates)
        found.update((h.chunk_id, h) for h in hits)
        rankings.append([h.chunk_id for h in hits])
    if embedder is not None:
        vectors = await _query_vectors(embedder, queries)
        rankings.extend(await _vector_rankings(store, keys, vectors, candidates))
    scores = fuse(rankings)
    best = sorted(scores, key=lambda chunk_id: (-scores[chunk_id], chunk_id))[:limit]
    missing = [chunk_id for chunk_id in best if chunk_id not in found]
    found.update((h.chunk_id, h) for h in await store.chunks_by_id(missing))
    return [ScoredChunk(found[i], scores[i]) for i in best if i in found]
