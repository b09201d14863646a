"""How much one request may ask for: input items, characters of text, tools.

Characters are counted wherever the model will read them: input items, instructions and
the tools' names, descriptions and schemas.

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
# The payload of each media part, by its type: base64 or a URL, bounded by the media
# limits instead. Under any other key, or in a part of another type, a string is text.
_MEDIA_PAYLOADS: dict[str, frozenset[str]] = {
    "input_image": frozenset({"image_url"}),
    "image_url": frozenset({"image_url"}),
    "computer_screenshot": frozenset({"image_url"}),
    "input_file": frozenset({"file_data", "file_url"}),
    "file": frozenset({"file"}),
    "input_audio": frozenset({"input_audio"}),
}
_NO_PAYLOAD: frozenset[str] = frozenset()


def text_chars(value: Any) -> int:
    """Characters the model may read in a JSON value: every string, object keys included
    (a tool output part of an unknown type reaches the prompt as JSON, a tool's schema
    with its property names), except the payloads of media parts. Iterative: the depth
    of a client's JSON is the client's choice."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            kind = item.get("type")
            skip = _MEDIA_PAYLOADS.get(kind, _NO_PAYLOAD) if isinstance(kind, str) else _NO_PAYLOAD
            for key, entry in item.items():
                total += len(key)
                if key not in skip:
                    stack.append(entry)
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
        if tools is not None and len(tools) > self.max_tools:
            raise InvalidRequest(
                f"Invalid 'tools': {len(tools)} tools, more than the {self.max_tools} this "
                "server accepts in one request.",
                param="tools",
                code="array_above_max_length",
            )
        chars = text_chars(items) + len(instructions or "") + text_chars(tools)
        if chars > self.max_chars:
            raise InvalidRequest(
                f"The input holds {chars} characters of text, more than the {self.max_chars} "
                "this server accepts in one request.",
                param=items_param,
                code="string_above_max_length",
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
