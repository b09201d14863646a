"""`POST /v1/embeddings`: the request as OpenAI documents it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

# OpenAI's limits: 2048 inputs a request; a token is a non-negative id.
MAX_INPUTS = 2048
TokenIds = list[Annotated[int, Field(ge=0)]]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    # A string, strings, token ids, or lists of token ids.
    input: str | list[str] | TokenIds | list[TokenIds]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None
