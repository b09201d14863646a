"""The prompt-cache fields both APIs take: `prompt_cache_key` and `prompt_cache_retention`.

The key steers a request to the KV cache the same key last filled (the engine's slot, or
its saved state), so requests sharing a long prefix reuse it. The retention says how long
a prefix should outlive its request: `in_memory` (the default: the engine's caches, least
recently used first out), or `24h`, which keeps the prompt's KV in the engine's
longest-lived tier (written to the disk tier at once, where there is one) and evicts it
only after every entry not so marked.
"""

from __future__ import annotations

from dataclasses import dataclass

from respd.protocol.errors import InvalidRequest

# OpenAI's spelling, and the hyphenated one its guide once used.
RETENTIONS = {"in_memory": "in_memory", "in-memory": "in_memory", "24h": "24h"}
MAX_KEY_CHARS = 1024


@dataclass(frozen=True)
class PromptCache:
    """A request's prompt-cache settings, checked: the key (None: none given) and the
    retention as OpenAI spells it (None: not asked)."""

    key: str | None = None
    retention: str | None = None

    @property
    def retain(self) -> bool:
        return self.retention == "24h"


def prompt_cache(key: object, retention: object) -> PromptCache:
    """Check a request's `prompt_cache_key` and `prompt_cache_retention` (400s name the
    field)."""
    if key is not None and not isinstance(key, str):
        raise InvalidRequest(
            "Invalid type for 'prompt_cache_key': expected a string.",
            param="prompt_cache_key",
            code="invalid_type",
        )
    if isinstance(key, str) and len(key) > MAX_KEY_CHARS:
        raise InvalidRequest(
            f"Invalid 'prompt_cache_key': string too long. Expected a string with maximum "
            f"length {MAX_KEY_CHARS}, but got a string with length {len(key)} instead.",
            param="prompt_cache_key",
            code="string_above_max_length",
        )
    if retention is not None and (not isinstance(retention, str) or retention not in RETENTIONS):
        raise InvalidRequest(
            f"Invalid value for 'prompt_cache_retention': {retention!r}. Supported values "
            "are: 'in_memory' and '24h'.",
            param="prompt_cache_retention",
            code="invalid_value",
        )
    return PromptCache(key, RETENTIONS[retention] if isinstance(retention, str) else None)
