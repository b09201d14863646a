"""Chunking strategies (OpenAI's `auto` and `static`) and the chunker.

Tokens are counted approximately, without a tokenizer: a whitespace-separated word counts
ceil(len/4) tokens (about four characters a token, as OpenAI's tokenizers average on
English), at least one. So a chunk of `max_chunk_size_tokens` holds about that many
model tokens of prose whichever embedding model indexes it."""

from __future__ import annotations

import math
import re
from typing import Any

from respd.protocol.errors import InvalidRequest

AUTO_MAX_TOKENS = 800  # OpenAI's `auto` strategy
AUTO_OVERLAP_TOKENS = 400
MIN_CHUNK_TOKENS = 100
MAX_CHUNK_TOKENS = 4096
CHARS_PER_TOKEN = 4

_WORD = re.compile(r"\S+\s*")


def static_strategy(max_tokens: int, overlap: int) -> dict[str, Any]:
    return {
        "type": "static",
        "static": {"max_chunk_size_tokens": max_tokens, "chunk_overlap_tokens": overlap},
    }


def _int(value: Any, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(
            f"Invalid type for '{param}': expected an integer, got {type(value).__name__}.",
            param=param,
            code="invalid_type",
        )
    return value


def check_strategy(raw: Any, param: str = "chunking_strategy") -> dict[str, Any]:
    """The request's strategy as the static strategy object a file reports (`auto` is
    800 tokens with 400 of overlap); a 400 naming the field otherwise."""
    if raw is None:
        return static_strategy(AUTO_MAX_TOKENS, AUTO_OVERLAP_TOKENS)
    if not isinstance(raw, dict):
        raise InvalidRequest(
            f"Invalid type for '{param}': expected an object.", param=param, code="invalid_type"
        )
    kind = raw.get("type")
    if kind == "auto":
        return static_strategy(AUTO_MAX_TOKENS, AUTO_OVERLAP_TOKENS)
    if kind != "static":
        raise InvalidRequest(
            f"Invalid value for '{param}.type': expected 'auto' or 'static', got {kind!r}.",
            param=f"{param}.type",
            code="invalid_value",
        )
    static = raw.get("static")
    if not isinstance(static, dict):
        raise InvalidRequest(
            f"Missing required parameter: '{param}.static'.",
            param=f"{param}.static",
            code="missing_required_parameter",
        )
    max_param = f"{param}.static.max_chunk_size_tokens"
    overlap_param = f"{param}.static.chunk_overlap_tokens"
    max_tokens = _int(static.get("max_chunk_size_tokens"), max_param)
    overlap = _int(static.get("chunk_overlap_tokens"), overlap_param)
    if not MIN_CHUNK_TOKENS <= max_tokens <= MAX_CHUNK_TOKENS:
        raise InvalidRequest(
            f"Invalid '{max_param}': expected a value between {MIN_CHUNK_TOKENS} and "
            f"{MAX_CHUNK_TOKENS}, got {max_tokens}.",
            param=max_param,
            code="invalid_value",
        )
    if not 0 <= overlap <= max_tokens // 2:
        raise InvalidRequest(
            f"Invalid '{overlap_param}': expected a value between 0 and half of "
            f"max_chunk_size_tokens ({max_tokens // 2}), got {overlap}.",
            param=overlap_param,
            code="invalid_value",
        )
    return static_strategy(max_tokens, overlap)


def approx_tokens(word: str) -> int:
    return max(1, math.ceil(len(word.strip()) / CHARS_PER_TOKEN))


def chunk_text(text: str, max_tokens: int, overlap: int) -> list[str]:
    """Consecutive runs of words of at most `max_tokens` (a longer single word is cut into
    pieces), each next run starting `overlap` tokens back; whitespace inside a chunk is
    kept, around it stripped."""
    words: list[str] = []
    for match in _WORD.finditer(text):
        word = match.group()
        limit = max_tokens * CHARS_PER_TOKEN
        words.extend(word[i : i + limit] for i in range(0, len(word), limit))
    costs = [approx_tokens(w) for w in words]
    chunks: list[str] = []
    start = 0
    while start < len(words):
        end, used = start, 0
        while end < len(words) and used + costs[end] <= max_tokens:
            used += costs[end]
            end += 1
        end = max(end, start + 1)
        chunk = "".join(words[start:end]).strip()
        if chunk:
            chunks.append(chunk)
        if end >= len(words):
            break
        back, kept = end, 0
        while back > start + 1 and kept + costs[back - 1] <= overlap:
            kept += costs[back - 1]
            back -= 1
        start = back
    return chunks
