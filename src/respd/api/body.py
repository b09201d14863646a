"""Read a JSON body into a protocol model, with OpenAI-shaped 400s and a log of unknown keys.

Before the model sees it, one iterative pass over the parsed body refuses what would fail
later, after work was done or half a stream was sent: nesting deeper than
`MAX_JSON_DEPTH`, numbers that are not finite (`NaN`, `Infinity`, `1e999`), and strings
holding lone UTF-16 surrogates (a `\\ud800` escape decodes to a code point that cannot be
encoded as UTF-8, so storing or sending it back fails).
"""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from respd.api.errors import validation_error
from respd.protocol.errors import InvalidRequest

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

# Levels of arrays and objects a body may nest (the body object itself is level 1). Real
# bodies stay far shallower: the deepest part is a JSON Schema, whose property depth the
# schema checks bound at 10. The bound sits far below Python's recursion limit (1000),
# which pydantic, the schema walk, `json.dumps` when storing and the chat template all
# recurse against.
MAX_JSON_DEPTH = 128
# Longest `param` an error names; a longer path (huge keys) names its top-level field.
MAX_PARAM_CHARS = 256
_SURROGATE = re.compile("[\ud800-\udfff]")


class _NonFiniteLiteral(ValueError):
    """`NaN`, `Infinity` or `-Infinity`: accepted by Python's json, not JSON."""


def _reject_constant(name: str) -> float:
    raise _NonFiniteLiteral(name)


def _too_deep() -> InvalidRequest:
    return InvalidRequest(
        f"The JSON body of your request is nested deeper than {MAX_JSON_DEPTH} levels of "
        "arrays and objects.",
        code="invalid_json",
    )


# A path is a linked list from the leaf up: (parent path, key or index), None at the root.
_Path = tuple[Any, str | int] | None


def _param(path: _Path) -> str | None:
    parts: list[str | int] = []
    while path is not None:
        path, key = path
        parts.append(key)
    text = ""
    for key in reversed(parts):
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else key)
    if len(text) > MAX_PARAM_CHARS:
        top = parts[-1] if parts else None
        return top if isinstance(top, str) and len(top) <= MAX_PARAM_CHARS else None
    return text or None


def _bad_string(path: _Path) -> InvalidRequest:
    param = _param(path)
    where = f"'{param}'" if param else "the request body"
    return InvalidRequest(
        f"Invalid value for {where}: a string holds a lone UTF-16 surrogate (an escape in "
        "\\ud800-\\udfff without its pair), which is not valid Unicode.",
        param=param,
        code="invalid_value",
    )


def _bad_number(path: _Path) -> InvalidRequest:
    param = _param(path)
    where = f"'{param}'" if param else "the request body"
    return InvalidRequest(
        f"Invalid value for {where}: the number is too large; numbers must be finite.",
        param=param,
        code="invalid_value",
    )


def _bad_scalar(value: Any) -> bool:
    """A lone-surrogate string or a non-finite float."""
    if type(value) is str:
        return not value.isascii() and _SURROGATE.search(value) is not None
    return type(value) is float and not math.isfinite(value)


def _bad_key(key: str) -> bool:
    return not key.isascii() and _SURROGATE.search(key) is not None


def check_json(data: Any) -> None:
    """One iterative pass over a parsed body, a level at a time: depth, surrogates, finite
    numbers. It runs about as fast as `json.loads` itself; only when it finds something
    does a second walk (`_locate`) name the offending value's path."""
    level = [data]
    depth = 1
    search = _SURROGATE.search
    isfinite = math.isfinite
    while level:
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        below: list[Any] = []
        push = below.append
        for node in level:
            if type(node) is dict:
                for key in node:
                    if not key.isascii() and search(key):
                        _locate(data)
                node = node.values()
            elif type(node) is not list:
                if _bad_scalar(node):
                    _locate(data)
                continue
            for value in node:
                kind = type(value)
                if kind is dict or kind is list:
                    push(value)
                elif kind is str:
                    if not value.isascii() and search(value):
                        _locate(data)
                elif kind is float and not isfinite(value):
                    _locate(data)
        level = below
        depth += 1


def _locate(data: Any) -> None:
    """Raise the error for the first bad key or value, named by its path (`metadata.k`,
    `input[0].content`). A key holding a surrogate is named by its object's path, as the
    key itself cannot be sent back."""
    stack: list[tuple[Any, int, _Path]] = [(data, 1, None)]
    while stack:
        node, depth, path = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        if isinstance(node, dict):
            for key, value in node.items():
                if _bad_key(key):
                    raise _bad_string(path)
                stack.append((value, depth + 1, (path, key)))
        elif isinstance(node, list):
            stack.extend((value, depth + 1, (path, i)) for i, value in enumerate(node))
        elif isinstance(node, str) and _bad_scalar(node):
            raise _bad_string(path)
        elif _bad_scalar(node):
            raise _bad_number(path)
    # Not reached: `check_json` calls this only when one of the checks above fails.
    raise InvalidRequest("The request body holds an invalid value.", code="invalid_value")


def load_json(raw: bytes) -> Any:
    """`raw` parsed as strict JSON and checked by `check_json`; an `InvalidRequest` if not."""
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except _NonFiniteLiteral as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request: {exc} is not valid JSON; "
            "numbers must be finite.",
            code="invalid_json",
        ) from None
    except RecursionError:
        raise _too_deep() from None
    except ValueError as exc:  # malformed JSON or UTF-8, or an integer of over 4300 digits
        raise InvalidRequest(
            f"We could not parse the JSON body of your request ({exc}). The body must be "
            "valid JSON.",
            code="invalid_json",
        ) from exc
    check_json(data)
    return data


async def parse_body(request: Request, model: type[M]) -> M:
    raw = await request.body()
    return validate_object(load_json(raw) if raw else None, model, request.url.path)


def validate_object(data: Any, model: type[M], where: str) -> M:
    """Decoded JSON read into `model`: it must be an object; any problem is a 400 that
    names it; unknown fields are logged (as from `where`) and kept."""
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    try:
        parsed = model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from exc
    if parsed.model_extra:
        log.info("ignoring unknown field(s) on %s: %s", where, sorted(parsed.model_extra))
    return parsed
