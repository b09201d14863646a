"""Counts (`minLength`, `maxItems`, a pattern's `{m,n}`, ...) as GBNF repetitions.

`minLength`/`maxLength`/`minItems`/`maxItems` are native GBNF repetitions, split into
runs of at most 2000: llama.cpp refuses a larger minimum and does not hold a larger
maximum (`x{0,2001}` admits twice as many). Counts are refused when they are larger than
the grammar can hold: llama.cpp expands `x{m,n}` into n copies of `x`, so a `maxLength` of
10^9 would take gigabytes before the first token.
"""

from __future__ import annotations

from typing import Any

from respd.engines.constraints import SchemaRejected

# The largest count a schema may give: the grammar expands it into that many rule copies.
MAX_REPETITION = 4096


def check_bound(value: Any, key: str, path: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaRejected(f"'{key}' at {path} must be a non-negative integer")
    if value > MAX_REPETITION:
        raise SchemaRejected(
            f"'{key}' at {path} is {value}, above the largest bound the grammar can enforce "
            f"({MAX_REPETITION})"
        )


# The largest count a GBNF repetition `x{m,n}` may carry: llama.cpp refuses an `m` above
# it, and does not hold an `n` above it (`x{0,2001}` admits 4002 copies).
_GBNF_MAX_COUNT = 2000


def _quantifier(lo: int, hi: int | None) -> str:
    if hi is None:
        return {0: "*", 1: "+"}.get(lo, f"{{{lo},}}")
    if (lo, hi) == (0, 1):
        return "?"
    return "" if lo == hi == 1 else f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def repeat(item: str, lo: int, hi: int | None) -> str:
    """`item` (one GBNF symbol: a rule, literal, class or group) `lo` to `hi` times (None:
    no most), as repetitions whose counts llama.cpp holds: larger counts are split into
    runs, the optional copies nested so that each length has one parse."""
    parts = []
    while lo > _GBNF_MAX_COUNT:
        parts.append(f"{item}{{{_GBNF_MAX_COUNT}}}")
        lo -= _GBNF_MAX_COUNT
        hi = None if hi is None else hi - _GBNF_MAX_COUNT
    if hi is None or hi <= _GBNF_MAX_COUNT:
        return " ".join([*parts, item + _quantifier(lo, hi)]) if hi != 0 else " ".join(parts)
    if lo:
        parts.append(item + _quantifier(lo, lo))
    parts.append(_optional(item, hi - lo))
    return " ".join(parts)


def _optional(item: str, n: int) -> str:
    """`item` 0 to `n` times, in runs of at most `_GBNF_MAX_COUNT`."""
    if n <= _GBNF_MAX_COUNT:
        return item + _quantifier(0, n)
    rest = _optional(item, n - _GBNF_MAX_COUNT)
    return f"({item}{{{_GBNF_MAX_COUNT}}} {rest} | {item}{{0,{_GBNF_MAX_COUNT - 1}}})"
