"""How much one request may ask for: input items, characters of text, tools.

Checked first thing by both APIs, before any history is loaded or anything is stored, so
an oversized request costs one pass over its own body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from respd.protocol.errors import InvalidRequest

DEFAULT_MAX_INPUT_ITEMS = 4096
DEFAULT_MAX_INPUT_CHARS = 4_000_000
DEFAULT_MAX_TOOLS = 128
DEFAULT_MAX_REQUEST_BYTES = 64 * 2**20  # a JSON body, checked by the API's request guard
# Strings under these keys are media (base64 or URLs), bounded by the media limits instead.
_MEDIA_KEYS = frozenset({"image_url", "file_data", "file_url", "url", "data"})


def text_chars(value: Any) -> int:
    """Characters of text in a JSON value, media payloads left out (iterative: the depth
    of a client's JSON is the client's choice)."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(v for k, v in item.items() if k not in _MEDIA_KEYS)
        elif isinstance(item, list):
            stack.extend(item)
    return total


@dataclass(frozen=True)
class InputLimits:
    max_items: int = DEFAULT_MAX_INPUT_ITEMS
    max_chars: int = DEFAULT_MAX_INPUT_CHARS
    max_tools: int = DEFAULT_MAX_TOOLS
    max_output_tokens: int | None = None  # None: what fits in the context window

    def check(
        self,
        items: Any,
        instructions: str | None,
        tools: list[Any] | None,
        *,
        items_param: str,
    ) -> None:
        """Raise a 400 naming the parameter that is over its limit."""
        if isinstance(items, list) and len(items) > self.max_items:
            raise InvalidRequest(
                f"Invalid '{items_param}': {len(items)} items, more than the {self.max_items} "
                "this server accepts in one request.",
                param=items_param,
                code="array_above_max_length",
            )
        chars = text_chars(items) + len(instructions or "")
        if chars > self.max_chars:
            raise InvalidRequest(
                f"The input holds {chars} characters of text, more than the {self.max_chars} "
                "this server accepts in one request.",
                param=items_param,
                code="string_above_max_length",
            )
        if tools is not None and len(tools) > self.max_tools:
            raise InvalidRequest(
                f"Invalid 'tools': {len(tools)} tools, more than the {self.max_tools} this "
                "server accepts in one request.",
                param="tools",
                code="array_above_max_length",
            )

    def check_max_tokens(self, value: int | None, param: str) -> None:
        ceiling = self.max_output_tokens
        if ceiling is not None and value is not None and value > ceiling:
            raise InvalidRequest(
                f"Invalid '{param}': {value} is more than the {ceiling} tokens this server "
                "lets one request generate.",
                param=param,
                code="integer_above_max_value",
            )
