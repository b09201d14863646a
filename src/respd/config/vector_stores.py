"""The flag of the Vector Stores API: which embedding model indexes and searches them."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from respd.engines.embedding import Embedder


class VectorStoresConfig(BaseModel):
    model_config = ConfigDict(title="Vector stores")

    file_search_embedding_model: str | None = Field(
        None,
        description="The embedding model (an id /v1/embeddings serves, e.g. that of "
        "--embedding-model) that embeds vector store chunks and search queries; search then "
        "fuses full-text and vector rankings. Unset: full-text search only. Chunks indexed "
        "before it was set stay full-text only until their file is attached again.",
    )

    def file_search_embedder(self, embedders: Sequence[Embedder]) -> Embedder | None:
        model = self.file_search_embedding_model
        if model is None:
            return None
        for embedder in embedders:
            if embedder.model_id == model:
                return embedder
        known = ", ".join(e.model_id for e in embedders) or "none"
        raise SystemExit(
            f"respd: --file-search-embedding-model {model!r} is not an embedding model this "
            f"server serves (it serves: {known})"
        )
