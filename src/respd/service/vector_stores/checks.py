"""The checks of request values that the Vector Stores API adds: file attributes,
`expires_after`, search options. Each failure is a 400 naming the field."""

from __future__ import annotations

import math
from typing import Any

from respd.protocol.errors import InvalidRequest

MAX_ATTRIBUTES = 16
MAX_ATTRIBUTE_KEY = 64
MAX_ATTRIBUTE_VALUE = 512
MIN_EXPIRY_DAYS = 1
MAX_EXPIRY_DAYS = 365
MAX_RESULTS = 50
RANKERS = ("none", "auto", "default-2024-11-15")


def _bad(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


def check_attributes(raw: Any, param: str = "attributes") -> dict[str, Any]:
    """At most 16 keys of up to 64 characters; values strings (up to 512), numbers or
    booleans."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _bad(f"Invalid type for '{param}': expected an object.", param, "invalid_type")
    if len(raw) > MAX_ATTRIBUTES:
        raise _bad(
            f"Invalid '{param}': too many properties. Expected at most {MAX_ATTRIBUTES}, "
            f"but got {len(raw)}.",
            param,
            "object_above_max_properties",
        )
    for key, value in raw.items():
        if len(key) > MAX_ATTRIBUTE_KEY:
            raise _bad(
                f"Invalid '{param}': key {key[:20]!r}... is longer than {MAX_ATTRIBUTE_KEY} "
                "characters.",
                param,
            )
        if isinstance(value, str):
            if len(value) > MAX_ATTRIBUTE_VALUE:
                raise _bad(
                    f"Invalid '{param}.{key}': longer than {MAX_ATTRIBUTE_VALUE} characters.",
                    f"{param}.{key}",
                )
        elif not isinstance(value, bool | int | float) or (
            isinstance(value, float) and not math.isfinite(value)
        ):
            raise _bad(
                f"Invalid type for '{param}.{key}': expected a string, number or boolean.",
                f"{param}.{key}",
                "invalid_type",
            )
    return dict(raw)


def check_expires_after(raw: Any, param: str = "expires_after") -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _bad(f"Invalid type for '{param}': expected an object.", param, "invalid_type")
    if raw.get("anchor") != "last_active_at":
        raise _bad(
            f"Invalid value for '{param}.anchor': expected 'last_active_at', got "
            f"{raw.get('anchor')!r}.",
            f"{param}.anchor",
        )
    days = raw.get("days")
    if isinstance(days, bool) or not isinstance(days, int):
        raise _bad(f"Invalid type for '{param}.days': expected an integer.", f"{param}.days")
    if not MIN_EXPIRY_DAYS <= days <= MAX_EXPIRY_DAYS:
        raise _bad(
            f"Invalid '{param}.days': expected a value between {MIN_EXPIRY_DAYS} and "
            f"{MAX_EXPIRY_DAYS}, got {days}.",
            f"{param}.days",
        )
    return {"anchor": "last_active_at", "days": days}


def check_queries(query: Any, param: str = "query") -> list[str]:
    queries = [query] if isinstance(query, str) else query
    if (
        not isinstance(queries, list)
        or not queries
        or not all(isinstance(q, str) and q.strip() for q in queries)
    ):
        raise _bad(f"Invalid '{param}': expected a non-empty string or a list of them.", param)
    return queries


def check_max_results(value: Any, param: str = "max_num_results") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"Invalid type for '{param}': expected an integer.", param, "invalid_type")
    if not 1 <= value <= MAX_RESULTS:
        raise _bad(
            f"Invalid '{param}': expected a value between 1 and {MAX_RESULTS}, got {value}.",
            param,
        )
    return value


def check_ranking(raw: Any, param: str = "ranking_options") -> float:
    """The score threshold (0: none) of valid ranking options."""
    if raw is None:
        return 0.0
    if not isinstance(raw, dict):
        raise _bad(f"Invalid type for '{param}': expected an object.", param, "invalid_type")
    ranker = raw.get("ranker", "auto")
    if ranker not in RANKERS:
        raise _bad(
            f"Invalid value for '{param}.ranker': expected one of {', '.join(RANKERS)}, got "
            f"{ranker!r}.",
            f"{param}.ranker",
        )
    threshold = raw.get("score_threshold", 0.0)
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise _bad(
            f"Invalid type for '{param}.score_threshold': expected a number.",
            f"{param}.score_threshold",
            "invalid_type",
        )
    if not 0 <= threshold <= 1:
        raise _bad(
            f"Invalid '{param}.score_threshold': expected a value between 0 and 1, got "
            f"{threshold}.",
            f"{param}.score_threshold",
        )
    return float(threshold)
