"""Attribute filters (OpenAI's `ComparisonFilter` and `CompoundFilter`): checked once,
then evaluated against each file's `attributes`.

A comparison with a key the file lacks is false, except `ne` and `nin`, which are true
(the file does not have that value). Order comparisons (`gt`, `gte`, `lt`, `lte`) hold
between two numbers or two strings, never across types or on booleans."""

from __future__ import annotations

from typing import Any

from respd.protocol.errors import InvalidRequest

COMPARISONS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin")
COMPOUNDS = ("and", "or")
MAX_DEPTH = 8
_SCALAR = (str, int, float, bool)


def _bad(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="invalid_value")


def check_filter(raw: Any, param: str = "filters", depth: int = 0) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise InvalidRequest(
            f"Invalid type for '{param}': expected an object.", param=param, code="invalid_type"
        )
    if depth > MAX_DEPTH:
        raise _bad(f"Invalid '{param}': filters nest deeper than {MAX_DEPTH} levels.", param)
    kind = raw.get("type")
    if kind in COMPOUNDS:
        parts = raw.get("filters")
        if not isinstance(parts, list) or not parts:
            raise _bad(f"Invalid '{param}.filters': expected a non-empty list.", f"{param}.filters")
        checked = [check_filter(p, f"{param}.filters[{i}]", depth + 1) for i, p in enumerate(parts)]
        return {"type": kind, "filters": checked}
    if kind not in COMPARISONS:
        allowed = ", ".join(COMPARISONS + COMPOUNDS)
        raise _bad(
            f"Invalid '{param}.type': expected one of {allowed}, got {kind!r}.", f"{param}.type"
        )
    key = raw.get("key")
    if not isinstance(key, str) or not key:
        raise _bad(f"Invalid '{param}.key': expected a non-empty string.", f"{param}.key")
    value = raw.get("value")
    if kind in ("in", "nin"):
        if not isinstance(value, list) or not all(isinstance(v, _SCALAR) for v in value):
            raise _bad(
                f"Invalid '{param}.value': '{kind}' takes a list of strings, numbers or booleans.",
                f"{param}.value",
            )
    elif not isinstance(value, _SCALAR):
        raise _bad(
            f"Invalid '{param}.value': expected a string, number or boolean.", f"{param}.value"
        )
    return {"type": kind, "key": key, "value": value}


def _same(a: Any, b: Any) -> bool:
    """Equality that keeps booleans apart from the numbers 0 and 1."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _ordered(a: Any, b: Any) -> bool:
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b))
    return numbers or (isinstance(a, str) and isinstance(b, str))


def matches(flt: dict[str, Any] | None, attributes: dict[str, Any]) -> bool:
    """Whether a file with `attributes` passes the (checked) filter; None passes all."""
    if flt is None:
        return True
    kind = flt["type"]
    if kind == "and":
        return all(matches(f, attributes) for f in flt["filters"])
    if kind == "or":
        return any(matches(f, attributes) for f in flt["filters"])
    value = flt["value"]
    if flt["key"] not in attributes:
        return kind in ("ne", "nin")
    have = attributes[flt["key"]]
    if kind == "eq":
        return _same(have, value)
    if kind == "ne":
        return not _same(have, value)
    if kind == "in":
        return any(_same(have, v) for v in value)
    if kind == "nin":
        return not any(_same(have, v) for v in value)
    if not _ordered(have, value):
        return False
    return {
        "gt": have > value,
        "gte": have >= value,
        "lt": have < value,
        "lte": have <= value,
    }[kind]
