"""Constraints → GBNF grammars for llama.cpp's grammar sampler.

Forced tool calls and JSON-Schema answers are enforced while sampling: the grammar only
admits well-formed output whose JSON validates against the schema. Schema conversion uses
the converter llama-cpp-python ships (a port of llama.cpp's `json_schema_to_grammar.py`)
with fixes: string characters exclude the control characters JSON forbids unescaped, a
`type` list keeps the node's other keywords on every branch, and the keywords below get
rules of their own. The wrappers around calls (`<tool_call>` tags, `[TOOL_CALLS]`, ...)
come from the model family's `ToolFormat`.

What the grammar enforces, and the subset of valid values it admits where that is not all
of them:

- Integer bounds (`minimum`, `maximum`, `exclusive*`) become digit-range rules, so a
  `Field(ge=1, le=10)` answer can only be 1 to 10.
- Number bounds admit plain decimals (no exponent, no `-0`) with at most 16 integer and 16
  fraction digits. Every admitted value is within the bounds both exactly and as an IEEE
  double (what pydantic, zod and jsonschema compare): an exclusive bound becomes the
  nearest double beyond it, so `exclusiveMinimum: 0` admits neither `0` nor `0.000`.
- `multipleOf` must be a whole number: integers (and numbers, which are then written as
  integers) that are multiples of it. With both bounds and at most `MAX_ENUMERATED`
  multiples in between the values are listed; otherwise a divisibility automaton over the
  decimal digits becomes rules, for divisors whose minimal automaton has at most
  `MAX_DIVISOR_STATES` states (and rules of at most `MAX_DIVISOR_GRAMMAR` characters).
  A fractional `multipleOf` is refused: validators disagree on it (jsonschema rejects
  0.07 as a multiple of 0.01, pydantic rejects large ones).
- `format`: `date` (real calendar dates, years 0001-9999, leap years included),
  `time` (`hh:mm:ss`, up to 6 fraction digits, then `Z` or `±hh:mm`), `date-time`
  (`<date>T<time>`), `uuid` (8-4-4-4-12 hex digits) and `email` (dot-atom local part of up
  to 4 atoms of 1-15 characters, then 2 to 5 domain labels, the last alphabetic). Other
  formats, and any format beside a `pattern` (zod writes both: a pattern for the format),
  are annotations, as JSON Schema 2020-12 has them by default: not enforced.
- `pattern`: an ECMA-262 subset (literals, classes, `.`, `\\d \\w \\s` and their negations,
  groups, alternation, greedy or lazy quantifiers, `^`/`$` at the ends); the string must
  contain a match, so an unanchored side may hold any other text. Characters are written
  as JSON text (`"`, `\\` and control characters escaped), from the Basic Multilingual
  Plane only; `.` matches no line terminator (ECMA's). Shorthand classes admit their ASCII
  members only, so that engines with Unicode classes (Python, Rust) agree. Lookarounds,
  backreferences, word boundaries and Unicode property classes are refused.
- `minLength`/`maxLength`/`minItems`/`maxItems` are native GBNF repetitions, split into
  runs of at most 2000: llama.cpp refuses a larger minimum and does not hold a larger
  maximum (`x{0,2001}` admits twice as many).
- `minLength`/`maxLength` with `pattern` or an enforced `format` hold only where the
  pattern's or format's lengths already fit, or the pattern is anchored with one
  repetition of a single character class whose counts can absorb the bounds (as in
  `^[a-z]+$`); otherwise they are refused.

A schema the grammar cannot enforce is refused up front (`SchemaRejected`, a 400 naming the
keyword and its path) rather than silently loosened. Bounds are refused too when they are
larger than the grammar can hold: llama.cpp expands `x{m,n}` into n copies of `x`, so a
`maxLength` of 10^9 would take gigabytes before the first token.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

from llama_cpp.llama_grammar import (
    INVALID_RULE_CHARS_RE,
    PRIMITIVE_RULES,
    RESERVED_NAMES,
    BuiltinRule,
    SchemaConverter,
)

from respd.engines.base import ToolDefinition
from respd.engines.constraints import (
    NO_PARAMETERS,
    Constraint,
    ConstraintError,
    SchemaRejected,
    check_schema,
)
from respd.engines.families.reasoning import ReasoningStyle
from respd.engines.families.tools import ToolFormat

# Keywords that restrict values in ways the grammar here does not enforce.
UNSUPPORTED_KEYWORDS = frozenset(
    {
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "patternProperties",
        "propertyNames",
        "unevaluatedProperties",
        "unevaluatedItems",
        "contains",
        "minContains",
        "maxContains",
        "minProperties",
        "maxProperties",
    }
)
# Numeric bounds: digit-range rules for integers, decimal-range rules for other numbers.
BOUND_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
NUMERIC_KEYWORDS = (*BOUND_KEYWORDS, "multipleOf")
# Counts the grammar expands into that many rule copies.
REPETITION_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems")
MAX_REPETITION = 4096
_PATTERN_BOUND = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
# Every quantifier of a pattern together: each copy is a symbol llama.cpp allocates.
MAX_PATTERN_REPETITION = 4 * MAX_REPETITION

# Bounded numbers are written with at most this many integer and fraction digits (the
# converter's own number rule allows 16 of each too).
NUMBER_INTEGER_DIGITS = 16
NUMBER_FRACTION_DIGITS = 16
# `multipleOf` with both bounds lists the multiples when there are at most this many.
MAX_ENUMERATED = 1000
# Otherwise divisibility is an automaton over the digits: divisors up to MAX_DIVISOR whose
# minimal automaton has at most MAX_DIVISOR_STATES states (each state is a rule per length
# of digits), in at most MAX_DIVISOR_GRAMMAR characters of rules.
MAX_DIVISOR = 10_000
MAX_DIVISOR_STATES = 128
MAX_DIVISOR_GRAMMAR = 400_000

# How much thinking a constrained answer may be preceded by, in characters, per effort.
THINKING_CHARS = {"minimal": 128, "low": 512, "medium": 2048, "high": 8192}
DEFAULT_THINKING_CHARS = 2048

# JSON strings may not hold raw control characters.
_HEX4 = " ".join(["[0-9a-fA-F]"] * 4)
_SAFE_CHAR = BuiltinRule(r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" ' + _HEX4 + ")", [])


def _types(node: dict[str, Any]) -> set[str] | None:
    """The JSON types a schema node allows by its `type` (None: no `type`)."""
    value = node.get("type")
    if isinstance(value, str):
        return {value}
    if isinstance(value, list):
        return {t for t in value if isinstance(t, str)}
    return None


def check_schema_for_grammar(schema: Any) -> None:
    """Refuse schemas the grammar cannot enforce, before any grammar is built."""
    for path, node in check_schema(schema):
        for key, value in node.items():
            if key in UNSUPPORTED_KEYWORDS or (key == "uniqueItems" and value):
                raise SchemaRejected(f"the keyword '{key}' at {path} cannot be enforced")
            if key in REPETITION_KEYWORDS:
                _check_bound(value, key, path)
        for low, high in (("minLength", "maxLength"), ("minItems", "maxItems")):
            if low in node and high in node and node[low] > node[high]:
                raise SchemaRejected(f"'{low}' and '{high}' at {path} admit no value")
        types = _types(node)
        numeric = [key for key in NUMERIC_KEYWORDS if key in node]
        if numeric and types is None:
            raise SchemaRejected(
                f"the keyword '{numeric[0]}' at {path} can be enforced only with a 'type' "
                "of 'integer' or 'number'"
            )
        if numeric and types is not None:
            for kind in ("integer", "number"):
                if kind in types:
                    numeric_rule(node, kind, "check", path)
        if types is None or "string" in types:
            if "pattern" in node:
                _pattern_plan(node, path)
            _check_format(node, path)


def _check_bound(value: Any, key: str, path: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaRejected(f"'{key}' at {path} must be a non-negative integer")
    if value > MAX_REPETITION:
        raise SchemaRejected(
            f"'{key}' at {path} is {value}, above the largest bound the grammar can enforce "
            f"({MAX_REPETITION})"
        )


def _number(value: Any, key: str, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SchemaRejected(f"'{key}' at {path} must be a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise SchemaRejected(f"'{key}' at {path} must be a finite number")
    return number


def _exact(value: Any, key: str, path: str) -> Decimal:
    """The decimal a JSON number stands for (a float's shortest repr is its JSON text)."""
    _number(value, key, path)
    return Decimal(value) if isinstance(value, int) else Decimal(repr(value))


def _beyond(value: Any, key: str, path: str, up: bool) -> Decimal:
    """The nearest double strictly above (`up`) or below `value`, both as a double and
    exactly, as an exact decimal.

    Decimals from there on are beyond `value` exactly and, rounding being monotone, once
    rounded to doubles as validators compare them."""
    exact = _exact(value, key, path)
    step = math.inf if up else -math.inf
    number = math.nextafter(float(value), step)  # beyond it as a double
    while (Decimal(number) <= exact) if up else (Decimal(number) >= exact):
        number = math.nextafter(number, step)  # and exactly (an integer above 2**53)
    if math.isinf(number):
        raise SchemaRejected(f"the number bounds at {path} admit no value")
    return Decimal(number)


def integer_bounds(schema: dict[str, Any], path: str = "#") -> tuple[int | None, int | None]:
    """The smallest and largest integer `schema` admits (None: unbounded), from
    `minimum`/`maximum` and `exclusiveMinimum`/`exclusiveMaximum` (numbers, or draft 4's
    booleans)."""
    lo: int | None = None
    hi: int | None = None
    if "minimum" in schema:
        lo = math.ceil(_number(schema["minimum"], "minimum", path))
        if schema.get("exclusiveMinimum") is True and lo == schema["minimum"]:
            lo += 1
    if "maximum" in schema:
        hi = math.floor(_number(schema["maximum"], "maximum", path))
        if schema.get("exclusiveMaximum") is True and hi == schema["maximum"]:
            hi -= 1
    for key, step in (("exclusiveMinimum", 1), ("exclusiveMaximum", -1)):
        value = schema.get(key)
        if value is None or isinstance(value, bool):
            continue
        bound = _number(value, key, path)
        if step > 0:
            edge = math.floor(bound) + 1
            lo = edge if lo is None else max(lo, edge)
        else:
            edge = math.ceil(bound) - 1
            hi = edge if hi is None else min(hi, edge)
    if lo is not None and hi is not None and lo > hi:
        raise SchemaRejected(f"the integer bounds at {path} admit no value")
    return lo, hi


def number_bounds(schema: dict[str, Any], path: str = "#") -> tuple[Decimal | None, Decimal | None]:
    """Inclusive decimal bounds (None: unbounded) such that every decimal between them
    meets the schema's `minimum`/`maximum`/`exclusive*`, exactly and as a double."""
    lows: list[Decimal] = []
    highs: list[Decimal] = []
    for key, bounds, up in (("minimum", lows, True), ("maximum", highs, False)):
        if key in schema:
            draft4 = schema.get("exclusive" + key.capitalize()) is True
            value = schema[key]
            bounds.append(_beyond(value, key, path, up) if draft4 else _exact(value, key, path))
    for key, bounds, up in (("exclusiveMinimum", lows, True), ("exclusiveMaximum", highs, False)):
        value = schema.get(key)
        if value is not None and not isinstance(value, bool):
            bounds.append(_beyond(value, key, path, up))
    lo = max(lows) if lows else None
    hi = min(highs) if highs else None
    if lo is not None and hi is not None and lo > hi:
        raise SchemaRejected(f"the number bounds at {path} admit no value")
    return lo, hi


def _same_length(a: str, b: str) -> list[list[str]]:
    """GBNF sequences (lists of atoms) matching exactly the digit strings from `a` to `b`,
    both of one length."""
    if not a:
        return [[]]
    if a[0] == b[0]:
        return [[f'"{a[0]}"', *rest] for rest in _same_length(a[1:], b[1:])]
    n = len(a) - 1
    out: list[list[str]] = []
    first, last = int(a[0]), int(b[0])
    if a[1:] != "0" * n:
        out += [[f'"{a[0]}"', *rest] for rest in _same_length(a[1:], "9" * n)]
        first += 1
    tail: list[list[str]] = []
    if b[1:] != "9" * n:
        tail = [[f'"{b[0]}"', *rest] for rest in _same_length("0" * n, b[1:])]
        last -= 1
    if first <= last:
        digit = f'"{first}"' if first == last else f"[{first}-{last}]"
        out.append([digit] + ["[0-9]"] * n)
    return out + tail


def _natural_range(lo: int, hi: int | None) -> list[list[str]]:
    """Sequences for the non-negative integers from `lo` to `hi` (None: no end), written
    without leading zeros."""
    out: list[list[str]] = []
    length = len(str(lo))
    top = hi if hi is not None else 10**length - 1
    while lo <= top:
        end = min(top, 10**length - 1)
        out += _same_length(str(lo), str(end))
        lo, length = end + 1, length + 1
    if hi is None:  # and every longer number
        out.append(["[1-9]"] + ["[0-9]"] * (length - 1) + ["[0-9]*"])
    return out


def _integer_sequences(lo: int | None, hi: int | None) -> list[list[str]]:
    """Sequences for the JSON integers from `lo` to `hi` (None: unbounded); negatives start
    with the atom `"-"`."""
    sequences: list[list[str]] = []
    if lo is None or lo < 0:  # the negatives: "-" then their magnitude
        low_magnitude = 1 if hi is None or hi >= 0 else -hi
        high_magnitude = None if lo is None else -lo
        sequences += [['"-"', *seq] for seq in _natural_range(low_magnitude, high_magnitude)]
    if hi is None or hi >= 0:
        sequences += _natural_range(max(lo or 0, 0), hi)
    return sequences


def integer_range_rule(lo: int | None, hi: int | None) -> str:
    """A GBNF expression for the JSON integers from `lo` to `hi` (None: unbounded)."""
    return "(" + " | ".join(" ".join(seq) for seq in _integer_sequences(lo, hi)) + ")"


def _split(value: Decimal) -> tuple[int, str]:
    """A non-negative decimal's integer part and fraction digits (no trailing zeros)."""
    whole, _, fraction = format(value, "f").partition(".")
    return int(whole), fraction.rstrip("0")


def _digit_class(digits: Sequence[int]) -> str:
    """A GBNF atom for a set of decimal digits."""
    if len(digits) == 1:
        return f'"{digits[0]}"'
    if list(digits) == list(range(digits[0], digits[-1] + 1)):
        return f"[{digits[0]}-{digits[-1]}]"
    return "[" + "".join(map(str, digits)) + "]"


def _fraction_tails(low: str, high: str | None, n: int) -> str | None:
    """Fraction digit strings `s` of 1 to `n` digits with 0.`low` <= 0.`s` <= 0.`high`
    (`high` None: no upper bound); `low` and `high` have no trailing zeros. None: none."""
    if n == 0:
        return None
    if high == "":  # at most zero: zeros only
        return f'"0"{{1,{n}}}'
    first = int(low[0]) if low else 0
    last = int(high[0]) if high is not None else 9
    alternatives = []
    free = [d for d in range(first, last + 1) if not (low and d == first)]
    free = [d for d in free if not (high is not None and d == last)]
    if free:
        rest = f" [0-9]{{0,{n - 1}}}" if n > 1 else ""
        alternatives.append(_digit_class(free) + rest)
    tight = ({first} if low else set()) | ({last} if high is not None else set())
    for d in sorted(tight):
        next_low = low[1:] if low and d == first else ""
        next_high = high[1:] if high is not None and d == last else None
        tail = _fraction_tails(next_low, next_high, n - 1)
        if next_low == "":  # the fraction may end here
            alternatives.append(f'"{d}"' + (f" {tail}?" if tail else ""))
        elif tail is not None:
            alternatives.append(f'"{d}" {tail}')
    return "(" + " | ".join(alternatives) + ")" if alternatives else None


def _fraction(low: str, high: str | None) -> str | None:
    """The optional `.digits` after an integer part, for fractions from 0.`low` to 0.`high`
    (`high` None: below 1). "": no fraction; None: no value."""
    tails = _fraction_tails(low, high, NUMBER_FRACTION_DIGITS)
    if low == "":
        return f'("." {tails})?' if tails else ""
    return f'"." {tails}' if tails else None


def _magnitudes(lo: Decimal, hi: Decimal | None) -> list[str]:
    """Sequences for the non-negative decimals from `lo` to `hi` (None: to the largest
    `NUMBER_INTEGER_DIGITS`-digit integer part)."""
    cap = 10**NUMBER_INTEGER_DIGITS
    low_int, low_frac = _split(lo)
    high_int: int
    high_frac: str | None
    if hi is None or hi >= cap:
        high_int, high_frac = cap - 1, None
    else:
        high_int, high_frac = _split(hi)
    if low_int > high_int:
        return []

    def piece(whole: int, low: str, high: str | None) -> list[str]:
        fraction = _fraction(low, high)
        return [] if fraction is None else [f'"{whole}" {fraction}'.strip()]

    if low_int == high_int:
        return piece(low_int, low_frac, high_frac)
    out: list[str] = []
    start = low_int
    if low_frac:
        out += piece(low_int, low_frac, None)
        start += 1
    end = high_int if high_frac is None else high_int - 1
    any_fraction = _fraction("", None) or ""
    if start <= end:
        out += [" ".join([*seq, any_fraction]) for seq in _natural_range(start, end)]
    if high_frac is not None:
        out += piece(high_int, "", high_frac)
    return out


def number_range_rule(lo: Decimal | None, hi: Decimal | None) -> str | None:
    """A GBNF expression for JSON numbers from `lo` to `hi` (inclusive; None: unbounded),
    written as plain decimals (no exponent, no `-0`) of at most `NUMBER_INTEGER_DIGITS`
    integer and `NUMBER_FRACTION_DIGITS` fraction digits. None: no such number."""
    alternatives: list[str] = []
    zero = Decimal(0)
    if lo is None or lo < zero:  # negatives: "-" then a magnitude that is not zero
        smallest = Decimal(1).scaleb(-NUMBER_FRACTION_DIGITS)
        low = max(hi.copy_negate() if hi is not None else zero, smallest)
        high = lo.copy_negate() if lo is not None else None
        if high is None or low <= high:
            alternatives += [f'"-" {seq}' for seq in _magnitudes(low, high)]
    if hi is None or hi >= zero:
        alternatives += _magnitudes(max(lo, zero) if lo is not None else zero, hi)
    return "(" + " | ".join(alternatives) + ")" if alternatives else None


@functools.lru_cache(maxsize=64)
def _divisibility(k: int) -> tuple[tuple[int, ...], ...]:
    """The minimal automaton reading decimal digits that accepts multiples of `k`:
    `delta[state][digit]`; state 0 is both the start and the only accepting state."""
    classes = [0 if r == 0 else 1 for r in range(k)]
    count = len(set(classes))
    while True:
        signatures = [
            (classes[r], *(classes[(10 * r + d) % k] for d in range(10))) for r in range(k)
        ]
        ids: dict[tuple[int, ...], int] = {}
        refined = [ids.setdefault(sig, len(ids)) for sig in signatures]
        classes = refined
        if len(ids) == count:
            break
        count = len(ids)
    delta: dict[int, tuple[int, ...]] = {}
    for r in range(k):
        delta.setdefault(classes[r], tuple(classes[(10 * r + d) % k] for d in range(10)))
    assert classes[0] == 0
    return tuple(delta[state] for state in range(len(delta)))


def _atom_digits(atom: str) -> tuple[int, ...] | None:
    """The digits a digit-range atom (`"5"`, `[2-7]`, `[0-9]`) matches; None for `[0-9]*`."""
    if atom == "[0-9]*":
        return None
    if atom.startswith('"'):
        return (int(atom[1]),)
    return tuple(range(int(atom[1]), int(atom[3]) + 1))


def multiple_rule(
    k: int, lo: int | None, hi: int | None, prefix: str, path: str = "#"
) -> tuple[str, dict[str, str]]:
    """A GBNF expression for the multiples of `k` from `lo` to `hi` (None: unbounded), and
    the rules it uses, named from `prefix`."""
    if lo is not None:
        lo = -(-lo // k) * k
    if hi is not None:
        hi = hi // k * k
    if lo is not None and hi is not None:
        if lo > hi:
            raise SchemaRejected(f"the bounds and 'multipleOf' at {path} admit no value")
        if (hi - lo) // k < MAX_ENUMERATED:
            return "(" + " | ".join(f'"{v}"' for v in range(lo, hi + 1, k)) + ")", {}
    if k == 1:
        return integer_range_rule(lo, hi), {}
    refusal = SchemaRejected(
        f"'multipleOf' at {path} is {k}: divisibility by it takes more grammar rules than "
        f"can be enforced; bound the value with 'minimum' and 'maximum' to at most "
        f"{MAX_ENUMERATED} multiples"
    )
    if k > MAX_DIVISOR:
        raise refusal
    delta = _divisibility(k)
    if len(delta) > MAX_DIVISOR_STATES:
        raise refusal
    rules: dict[str, str] = {}
    memo: dict[tuple[int, bool, int], str | None] = {}

    def moves(state: int, digits: Iterable[int]) -> dict[int, list[int]]:
        targets: dict[int, list[int]] = {}
        for d in digits:
            targets.setdefault(delta[state][d], []).append(d)
        return targets

    def suffix(n: int, more: bool, state: int) -> str | None:
        """`n` free digits from `state`, then (`more`) any number more, ending divisible."""
        if n == 0 and not more:
            return "" if state == 0 else None
        key = (n, more, state)
        if key in memo:
            return memo[key]
        name = f"{prefix}-{'x' if more else 'f'}{n}-{state}"
        memo[key] = name
        alternatives = []
        for target, digits in moves(state, range(10)).items():
            rest = suffix(max(n - 1, 0), more, target)
            if rest is not None:
                alternatives.append(f"{_digit_class(digits)} {rest}".strip())
        if n == 0:  # any number of digits: may stop where divisible
            rules[name] = "(" + " | ".join(alternatives) + ")" + ("?" if state == 0 else "")
        elif alternatives:
            rules[name] = " | ".join(alternatives)
        else:
            memo[key] = None
        return memo[key]

    def expand(atoms: list[tuple[int, ...] | None], state: int) -> str | None:
        free = 0
        while free < len(atoms) and atoms[free] == tuple(range(10)):
            free += 1
        if free == len(atoms) or (free == len(atoms) - 1 and atoms[-1] is None):
            return suffix(free, free < len(atoms), state)
        alternatives = []
        digits = atoms[0]
        assert digits is not None
        for target, group in moves(state, digits).items():
            rest = expand(atoms[1:], target)
            if rest is not None:
                alternatives.append(f"{_digit_class(group)} {rest}".strip())
        return "(" + " | ".join(alternatives) + ")" if alternatives else None

    alternatives = []
    for seq in _integer_sequences(lo, hi):
        sign = '"-" ' if seq[0] == '"-"' else ""
        body = expand([_atom_digits(atom) for atom in (seq[1:] if sign else seq)], 0)
        if body is not None:
            alternatives.append(sign + body)
    expr = "(" + " | ".join(alternatives) + ")"
    if len(expr) + sum(len(name) + len(rule) for name, rule in rules.items()) > MAX_DIVISOR_GRAMMAR:
        raise refusal
    return expr, rules


def _divisor(value: Any, path: str) -> int:
    """`multipleOf` as the whole number it must be for the grammar to enforce it."""
    _number(value, "multipleOf", path)
    exact = _exact(value, "multipleOf", path)
    if exact <= 0:
        raise SchemaRejected(f"'multipleOf' at {path} must be a positive number")
    if exact != exact.to_integral_value():
        raise SchemaRejected(
            f"'multipleOf' at {path} is {value}: the grammar enforces whole-number divisors only"
        )
    return int(exact)


def numeric_rule(
    schema: dict[str, Any], kind: str, prefix: str, path: str = "#"
) -> tuple[str, dict[str, str]]:
    """A GBNF expression for the `kind` ('integer' or 'number') values `schema`'s bounds
    and `multipleOf` admit, and the rules it uses (named from `prefix`)."""
    k = _divisor(schema["multipleOf"], path) if "multipleOf" in schema else None
    if kind == "integer":
        lo, hi = integer_bounds(schema, path)
    else:
        low, high = number_bounds(schema, path)
        if k is None:
            rule = number_range_rule(low, high)
            if rule is None:
                raise SchemaRejected(
                    f"the number bounds at {path} admit no number the grammar can write "
                    f"(at most {NUMBER_INTEGER_DIGITS} integer and {NUMBER_FRACTION_DIGITS} "
                    "fraction digits)"
                )
            return rule, {}
        lo = None if low is None else int(low.to_integral_value(rounding=ROUND_CEILING))
        hi = None if high is None else int(high.to_integral_value(rounding=ROUND_FLOOR))
        if lo is not None and hi is not None and lo > hi:
            raise SchemaRejected(f"the number bounds at {path} admit no whole number")
    if k is None:
        return integer_range_rule(lo, hi), {}
    return multiple_rule(k, lo, hi, prefix, path)


# Patterns: a regex subset parsed into sets of characters, sequences, alternatives and
# repetitions, then written as GBNF over the JSON text of the string.

_Ranges = tuple[tuple[int, int], ...]
_MAX_CODE = 0x10FFFF


def _ranges(pairs: Iterable[tuple[int, int]]) -> _Ranges:
    """Sorted, merged code point ranges."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(pairs):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return tuple(out)


def _complement(ranges: _Ranges) -> _Ranges:
    out: list[tuple[int, int]] = []
    start = 0
    for a, b in ranges:
        if a > start:
            out.append((start, a - 1))
        start = max(start, b + 1)
    if start <= _MAX_CODE:
        out.append((start, _MAX_CODE))
    return tuple(out)


def _intersect(a: _Ranges, b: _Ranges) -> _Ranges:
    return _complement(_ranges(_complement(a) + _complement(b)))


def _minus(a: _Ranges, b: _Ranges) -> _Ranges:
    return _intersect(a, _complement(b))


_ASCII: _Ranges = ((0, 0x7F),)
_DIGITS: _Ranges = ((0x30, 0x39),)
_WORD = _ranges([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
_SPACE = _ranges([(0x09, 0x0D), (0x20, 0x20)])
# Python's `\s` also holds \x1c-\x1f, which ECMA and Rust count as non-space.
_PY_SPACE = _ranges([*_SPACE, (0x1C, 0x1F)])
# Shorthand classes: what the grammar admits for each (its ASCII members on which the
# regex engines agree: Python's and Rust's, which pydantic validates with, also hold other
# Unicode letters, digits and spaces), and, for negated classes, the ASCII characters any
# engine may count in it.
_SHORTHANDS: dict[str, tuple[_Ranges, _Ranges]] = {
    "d": (_DIGITS, _DIGITS),
    "D": (_minus(_ASCII, _DIGITS), _minus(_ASCII, _DIGITS)),
    "w": (_WORD, _WORD),
    "W": (_minus(_ASCII, _WORD), _minus(_ASCII, _WORD)),
    "s": (_SPACE, _PY_SPACE),
    "S": (_minus(_ASCII, _PY_SPACE), _minus(_ASCII, _SPACE)),
}
# `.` matches no line terminator in ECMA (Python and Rust exclude only "\n").
_DOT = _complement(_ranges([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]))
# What the grammar writes as one character: the BMP without surrogates (in JavaScript an
# astral character is two units, which `.` and lengths would count differently).
_WRITABLE = _ranges([(0, 0xD7FF), (0xE000, 0xFFFF)])
# Characters JSON text escapes; the rest are written as they are.
_ESCAPED = _ranges([(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)])
_JSON_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n"}
_JSON_ESCAPES |= {0x0D: "\\r", 0x09: "\\t"}


@dataclass(frozen=True)
class _Set:
    chars: _Ranges


@dataclass(frozen=True)
class _Seq:
    items: tuple[_Node, ...]


@dataclass(frozen=True)
class _Alt:
    options: tuple[_Node, ...]


@dataclass(frozen=True)
class _Rep:
    item: _Node
    lo: int
    hi: int | None


@dataclass(frozen=True)
class _Anchor:
    end: bool


_Node = _Set | _Seq | _Alt | _Rep | _Anchor


class _PatternError(Exception):
    """A construct of a pattern that the grammar cannot enforce; the message names it."""


_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")


class _PatternParser:
    """A recursive-descent parser for the regex subset (ECMA-262 syntax)."""

    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.i = 0

    def parse(self) -> _Node:
        node = self._alternatives()
        if self.i < len(self.text):
            raise _PatternError("an unbalanced ')'")
        return node

    def _peek(self, ahead: int = 0) -> str:
        i = self.i + ahead
        return self.text[i] if i < len(self.text) else ""

    def _alternatives(self) -> _Node:
        options = [self._sequence()]
        while self._peek() == "|":
            self.i += 1
            options.append(self._sequence())
        return options[0] if len(options) == 1 else _Alt(tuple(options))

    def _sequence(self) -> _Node:
        items: list[_Node] = []
        while self._peek() not in ("", "|", ")"):
            items.append(self._quantified(self._atom()))
        return items[0] if len(items) == 1 else _Seq(tuple(items))

    def _atom(self) -> _Node:
        c = self._peek()
        self.i += 1
        if c == "(":
            return self._group()
        if c == "[":
            return self._class()
        if c == ".":
            return _Set(_DOT)
        if c in "^$":
            return _Anchor(end=c == "$")
        if c in "*+?":
            raise _PatternError(f"a quantifier '{c}' with nothing to repeat")
        if c == "{":
            raise _PatternError("a '{' that repeats nothing")
        if c == "\\":
            chars, _, _ = self._escape(in_class=False)
            return _Set(chars)
        return _Set(((ord(c), ord(c)),))

    def _group(self) -> _Node:
        if self._peek() == "?":
            head = self.text[self.i : self.i + 3]
            if head.startswith(("?=", "?!")) or head in ("?<=", "?<!"):
                raise _PatternError("a lookaround")
            named = re.compile(r"\?<[A-Za-z_$][A-Za-z0-9_$]*>").match(self.text, self.i)
            if head.startswith("?:"):
                self.i += 2
            elif named:
                self.i = named.end()
            else:
                raise _PatternError(f"the group syntax '({head}'")
        node = self._alternatives()
        if self._peek() != ")":
            raise _PatternError("an unbalanced '('")
        self.i += 1
        return node

    def _quantified(self, atom: _Node) -> _Node:
        c = self._peek()
        if c in ("*", "+", "?"):
            self.i += 1
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif c == "{":
            m = _QUANTIFIER.match(self.text, self.i)
            if m is None:
                raise _PatternError("a '{' that is not a repetition '{m}', '{m,}' or '{m,n}'")
            self.i = m.end()
            lo = int(m[1])
            hi = lo if m[2] is None else int(m[3]) if m[3] else None
            if hi is not None and hi < lo:
                raise _PatternError(f"the repetition '{m[0]}' (its maximum is below its minimum)")
        else:
            return atom
        if isinstance(atom, _Anchor):
            raise _PatternError("a repeated anchor")
        if self._peek() == "?":  # lazy: the same strings match
            self.i += 1
        if self._peek() in ("*", "+", "?", "{"):
            raise _PatternError("a quantifier on a quantifier")
        return _Rep(atom, lo, hi)

    def _class(self) -> _Set:
        negated = self._peek() == "^"
        if negated:
            self.i += 1
        if self._peek() == "]":
            raise _PatternError("an empty class '[]' (regex engines read it differently)")
        pairs: list[tuple[int, int]] = []  # what the class admits
        widest: list[tuple[int, int]] = []  # what some engine may count in it
        shorthand = False
        while self._peek() != "]":
            if self._peek() == "":
                raise _PatternError("an unbalanced '['")
            chars, first, outer = self._class_atom()
            if self._peek() == "-" and self._peek(1) not in ("]", ""):
                self.i += 1
                _, last, _ = self._class_atom()
                if first is None or last is None:
                    raise _PatternError("a class range with a shorthand class at an end")
                if last < first:
                    raise _PatternError("a class range out of order")
                pairs.append((first, last))
                widest.append((first, last))
            else:
                pairs += chars
                widest += outer or chars
                shorthand = shorthand or outer is not None
        self.i += 1
        if not negated:
            return _Set(_ranges(pairs))
        # Not in the class: with a shorthand in it, only ASCII characters no engine counts.
        chars = _complement(_ranges(widest))
        return _Set(_intersect(chars, _ASCII) if shorthand else chars)

    def _class_atom(self) -> tuple[_Ranges, int | None, _Ranges | None]:
        c = self._peek()
        if c == "\\":
            self.i += 1
            return self._escape(in_class=True)
        if c == "[" or self.text.startswith(("&&", "--", "~~", "||"), self.i):
            # Rust and Python (in future) read these as nested classes or set operations.
            raise _PatternError(f"'{self.text[self.i : self.i + 2]}' inside a class")
        self.i += 1
        return ((ord(c), ord(c)),), ord(c), None

    def _escape(self, in_class: bool) -> tuple[_Ranges, int | None, _Ranges | None]:
        """The characters of the escape after a backslash: (what the grammar admits for it,
        its one character or None, for a shorthand class the widest ASCII set an engine
        may read it as)."""
        c = self._peek()
        if not c:
            raise _PatternError("a trailing '\\'")
        self.i += 1
        if c in _SHORTHANDS:
            inner, outer = _SHORTHANDS[c]
            return inner, None, outer
        simple = {"t": 0x09, "n": 0x0A, "r": 0x0D, "v": 0x0B, "f": 0x0C}
        code: int | None = simple.get(c)
        if c == "0" and not self._peek().isdigit():
            code = 0
        elif c == "b" and in_class:
            code = 0x08
        elif c in "bB":
            raise _PatternError(f"a word boundary '\\{c}'")
        elif c.isdigit():
            raise _PatternError(f"a backreference '\\{c}'")
        elif c in "xu":
            size = 2 if c == "x" else 4
            digits = self.text[self.i : self.i + size]
            if not re.fullmatch(f"[0-9a-fA-F]{{{size}}}", digits):
                raise _PatternError(f"the escape '\\{c}{digits}'")
            self.i += size
            code = int(digits, 16)
            if 0xD800 <= code <= 0xDFFF:
                raise _PatternError(f"the surrogate escape '\\{c}{digits}'")
        elif c in "pP":
            raise _PatternError(f"a Unicode property class '\\{c}'")
        elif c == "k":
            raise _PatternError("a named backreference '\\k'")
        elif code is None and c.isascii() and c.isalnum():
            raise _PatternError(f"the escape '\\{c}'")
        elif code is None:
            code = ord(c)
        return ((code, code),), code, None


def _items(node: _Node) -> list[_Node]:
    return list(node.items) if isinstance(node, _Seq) else [node]


def _has_anchor(node: _Node) -> bool:
    if isinstance(node, _Anchor):
        return True
    if isinstance(node, _Seq):
        return any(map(_has_anchor, node.items))
    if isinstance(node, _Alt):
        return any(map(_has_anchor, node.options))
    return isinstance(node, _Rep) and _has_anchor(node.item)


def _lengths(node: _Node) -> tuple[int, int | None]:
    """The fewest and most characters `node` matches (None: no most)."""
    if isinstance(node, _Set):
        return 1, 1
    if isinstance(node, _Anchor):
        return 0, 0
    if isinstance(node, _Seq):
        lo: int = 0
        hi: int | None = 0
        for item in node.items:
            a, b = _lengths(item)
            lo += a
            hi = None if hi is None or b is None else hi + b
        return lo, hi
    if isinstance(node, _Alt):
        ends = [_lengths(option) for option in node.options]
        highs = [b for _, b in ends]
        return min(a for a, _ in ends), None if None in highs else max(b or 0 for b in highs)
    a, b = _lengths(node.item)
    if node.hi == 0:
        return 0, 0
    return node.lo * a, None if node.hi is None or b is None else node.hi * b


def _repetition(node: _Node) -> int:
    """The symbols llama.cpp allocates for the pattern's bounded repetitions."""
    if isinstance(node, _Seq):
        return sum(map(_repetition, node.items))
    if isinstance(node, _Alt):
        return sum(map(_repetition, node.options))
    if isinstance(node, _Rep):
        return max(node.lo, node.hi or 0) + _repetition(node.item)
    return 0


def _writable(node: _Node) -> bool:
    """Whether every class holds a character the grammar can write."""
    if isinstance(node, _Set):
        return bool(_intersect(node.chars, _WRITABLE))
    if isinstance(node, _Seq):
        return all(map(_writable, node.items))
    if isinstance(node, _Alt):
        return all(map(_writable, node.options))
    return not isinstance(node, _Rep) or _writable(node.item)


# One alternative of a pattern: anchored at the start, anchored at the end, its items.
_Branch = tuple[bool, bool, list[_Node]]


def _pattern_plan(schema: dict[str, Any], path: str) -> list[_Branch]:
    """The branches of `schema`'s pattern, with `minLength`/`maxLength` folded in, or a
    `SchemaRejected` naming what cannot be enforced."""
    pattern = schema["pattern"]
    if not isinstance(pattern, str):
        raise SchemaRejected(f"'pattern' at {path} must be a string")
    for m in _PATTERN_BOUND.finditer(pattern):
        for bound in m.groups():
            if bound:
                _check_bound(int(bound), "pattern", path)
    try:
        tree = _PatternParser(pattern).parse()
        branches: list[_Branch] = []
        for option in tree.options if isinstance(tree, _Alt) else (tree,):
            items = _items(option)
            start = end = False
            while items and isinstance(items[0], _Anchor) and not items[0].end:
                items, start = items[1:], True
            while items and isinstance(items[-1], _Anchor) and items[-1].end:
                items, end = items[:-1], True
            if any(map(_has_anchor, items)):
                raise _PatternError("an anchor ('^' or '$') inside the pattern")
            if not all(map(_writable, items)):
                raise _PatternError(
                    "a character or class with none the grammar can write (it writes the "
                    "Basic Multilingual Plane)"
                )
            branches.append((start, end, items))
        if sum(_repetition(_Seq(tuple(b[2]))) for b in branches) > MAX_PATTERN_REPETITION:
            raise _PatternError(f"more than {MAX_PATTERN_REPETITION} repetitions in all")
    except _PatternError as exc:
        raise SchemaRejected(
            f"the 'pattern' at {path} uses {exc}, which the grammar cannot enforce"
        ) from exc
    return _fit_lengths(branches, schema, path)


def _fit_lengths(branches: list[_Branch], schema: dict[str, Any], path: str) -> list[_Branch]:
    """`branches` such that every match also has `schema`'s `minLength`/`maxLength`."""
    low: int = schema.get("minLength", 0)
    high: int | None = schema.get("maxLength")
    if low == 0 and high is None:
        return branches
    spans = []
    for start, end, items in branches:
        a, b = _lengths(_Seq(tuple(items)))
        spans.append((a, b if start and end else None))
    if all(a >= low and (high is None or (b is not None and b <= high)) for a, b in spans):
        return branches
    if len(branches) == 1 and branches[0][0] and branches[0][1]:
        items = branches[0][2]
        ends = [_lengths(item) for item in items]
        varying = [i for i, (a, b) in enumerate(ends) if a != b]
        if len(varying) == 1:
            (v,) = varying
            rep = items[v]
            if isinstance(rep, _Rep) and isinstance(rep.item, _Set):
                fixed = sum(a for i, (a, _) in enumerate(ends) if i != v)
                lo = max(rep.lo, low - fixed)
                hi = rep.hi if high is None else high - fixed
                if rep.hi is not None and hi is not None:
                    hi = min(hi, rep.hi)
                if hi is not None and lo > hi:
                    raise SchemaRejected(
                        f"'minLength'/'maxLength' and 'pattern' at {path} admit no string"
                    )
                return [(True, True, [*items[:v], _Rep(rep.item, lo, hi), *items[v + 1 :]])]
    short = any(a < low for a, _ in spans)
    key = "minLength" if short else "maxLength"
    raise SchemaRejected(f"'{key}' at {path} cannot be enforced together with its 'pattern'")


def _class_char(code: int) -> str:
    if code < 0x80 and chr(code).isalnum():
        return chr(code)
    if code <= 0xFF:
        return f"\\x{code:02X}"
    if code <= 0xFFFF:
        return f"\\u{code:04X}"
    return f"\\U{code:08X}"


def _char_class(ranges: _Ranges, negated: bool = False) -> str:
    body = "".join(
        _class_char(a) if a == b else f"{_class_char(a)}-{_class_char(b)}" for a, b in ranges
    )
    return f"[{'^' if negated else ''}{body}]"


def _json_char(code: int) -> str:
    """A character as JSON text writes it inside a string."""
    if code in _JSON_ESCAPES:
        return _JSON_ESCAPES[code]
    if code < 0x20 or code == 0x7F:
        return f"\\u{code:04x}"
    return chr(code)


def _gbnf_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _set_expr(ranges: _Ranges) -> str:
    """GBNF for one character of `ranges`, as JSON text (escaped where JSON needs it)."""
    ranges = _intersect(ranges, _WRITABLE)
    plain = _minus(ranges, _ESCAPED)
    alternatives = []
    if len(plain) == 1 and plain[0][0] == plain[0][1]:
        alternatives.append(_gbnf_literal(chr(plain[0][0])))
    elif plain:
        outside = _complement(plain)
        shorter = len(outside) < len(plain)
        alternatives.append(_char_class(outside, negated=True) if shorter else _char_class(plain))
    escaped = [code for a, b in _intersect(ranges, _ESCAPED) for code in range(a, b + 1)]
    alternatives += [
        _gbnf_literal(_JSON_ESCAPES[code]) for code in escaped if code in _JSON_ESCAPES
    ]
    by_high: dict[int, list[int]] = {}
    for code in escaped:
        if code not in _JSON_ESCAPES:  # "\u00XY", X grouping the Y digits (either case)
            by_high.setdefault(code >> 4, []).append(code & 0xF)
    for high, lows in by_high.items():
        digits = "".join(f"{low:x}{low:X}" if low > 9 else str(low) for low in lows)
        low_class = f'"{digits}"' if len(digits) == 1 else f"[{digits}]"
        alternatives.append(f'"\\\\u00{high:x}" {low_class}')
    return alternatives[0] if len(alternatives) == 1 else "(" + " | ".join(alternatives) + ")"


# Enforced string formats: GBNF rules (named so that no schema-derived rule clashes), and
# the fewest and most characters each admits.
_FORMATS: dict[str, tuple[int, int]] = {
    "date": (10, 10),
    "time": (9, 21),
    "date-time": (20, 32),
    "uuid": (36, 36),
    "email": (6, 168),
}
_HEX = "[0-9a-fA-F]"
_LEAP_YY = '("0" [48] | [2468] [048] | [13579] [26])'
_EMAIL_ATEXT = _char_class(_ranges((ord(c), ord(c)) for c in "!#$%&'*+/=?^_`{|}~-") + _WORD)
_ALNUM = "[0-9A-Za-z]"
_FORMAT_RULES: dict[str, str] = {
    "respd-year": '[1-9] [0-9]{3} | "0" [1-9] [0-9]{2} | "00" [1-9] [0-9] | "000" [1-9]',
    "respd-leap-year": f'[0-9]{{2}} {_LEAP_YY} | {_LEAP_YY} "00"',
    "respd-day28": '"0" [1-9] | "1" [0-9] | "2" [0-8]',
    "respd-date": (
        'respd-year "-" ( ("0" [13578] | "1" [02]) "-" (respd-day28 | "29" | "3" [01])'
        ' | ("0" [469] | "11") "-" (respd-day28 | "29" | "30")'
        ' | "02-" respd-day28 ) | respd-leap-year "-02-29"'
    ),
    "respd-hour": '[01] [0-9] | "2" [0-3]',
    "respd-time": (
        'respd-hour ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})?'
        ' ("Z" | ("+" | "-") respd-hour ":" [0-5] [0-9])'
    ),
    "respd-date-time": 'respd-date "T" respd-time',
    "respd-uuid": ' "-" '.join(f"{_HEX}{{{n}}}" for n in (8, 4, 4, 4, 12)),
    "respd-email-atom": f"{_EMAIL_ATEXT}{{1,15}}",
    "respd-email-label": f"{_ALNUM} ([0-9A-Za-z\\x2D]{{0,20}} {_ALNUM})?",
    "respd-email": (
        'respd-email-atom ("." respd-email-atom){0,3} "@" (respd-email-label "."){1,4}'
        " [A-Za-z]{2,12}"
    ),
}


def _check_format(schema: dict[str, Any], path: str) -> None:
    """Refuse string lengths an enforced `format` would not keep."""
    name = schema.get("format")
    if name not in _FORMATS or "pattern" in schema:
        return
    shortest, longest = _FORMATS[name]
    if schema.get("minLength", 0) > shortest:
        key = "minLength"
    elif schema.get("maxLength", longest) < longest:
        key = "maxLength"
    else:
        return
    raise SchemaRejected(f"'{key}' at {path} cannot be enforced together with 'format': '{name}'")


_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"')
_ATOM = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[A-Za-z0-9-]+')


# The largest count a GBNF repetition `x{m,n}` may carry: llama.cpp refuses an `m` above
# it, and does not hold an `n` above it (`x{0,2001}` admits 4002 copies).
_GBNF_MAX_COUNT = 2000


def _quantifier(lo: int, hi: int | None) -> str:
    if hi is None:
        return {0: "*", 1: "+"}.get(lo, f"{{{lo},}}")
    if (lo, hi) == (0, 1):
        return "?"
    return "" if lo == hi == 1 else f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def _repeat(item: str, lo: int, hi: int | None) -> str:
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


class _Converter(SchemaConverter):
    def visit(self, schema: dict[str, Any], name: str) -> str:
        rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
        if any(key in schema for key in ("$ref", "anyOf", "oneOf")):
            return str(super().visit(schema, name))
        types = schema.get("type")
        if "const" in schema or "enum" in schema:
            # The values are the rule; a `type` list would otherwise be visited first.
            return str(super().visit({k: v for k, v in schema.items() if k != "type"}, name))
        if isinstance(types, list):
            # Each type keeps the node's other keywords (bounds, lengths, properties, ...).
            alternatives = [
                self.visit({**schema, "type": t}, f"{name}{'-' if name else 'alternative-'}{i}")
                for i, t in enumerate(types)
            ]
            return str(self._add_rule(rule_name, " | ".join(alternatives)))
        if types in ("integer", "number") and any(k in schema for k in NUMERIC_KEYWORDS):
            prefix = self._fresh(f"{rule_name}-mod")
            expr, rules = numeric_rule(schema, types, prefix)
            self._rules.update(rules)
            return str(self._add_rule(rule_name, expr + " space"))
        formatted = schema.get("format") in _FORMATS
        if types == "string" or (types is None and ("pattern" in schema or formatted)):
            if "pattern" in schema:
                return self._pattern_rule(schema, rule_name)
            if formatted:
                rule = self._add_format(schema["format"])
                return str(self._add_rule(rule_name, f'"\\"" {rule} "\\"" space'))
            if types == "string" and ("minLength" in schema or "maxLength" in schema):
                # Native repetitions: the converter nests one group per optional character,
                # which llama.cpp refuses beyond about a thousand (pydantic's HttpUrl: 2083).
                char = str(self._add_primitive("char", PRIMITIVE_RULES["char"]))
                chars = _repeat(char, schema.get("minLength", 0), schema.get("maxLength"))
                return str(
                    self._add_rule(rule_name, f'"\\"" {chars} "\\"" space'.replace("  ", " "))
                )
        items = schema.get("items")
        if types in (None, "array") and isinstance(items, dict) and "prefixItems" not in schema:
            item = self.visit(items, f"{name}{'-' if name else ''}item")
            lo, hi = schema.get("minItems", 0), schema.get("maxItems")
            more = _repeat(f'("," space {item})', max(lo - 1, 0), None if hi is None else hi - 1)
            body = f"{item} {more}".strip()
            if hi == 0:
                body = ""
            elif lo == 0:
                body = self._optional_rule(f"{rule_name}-items", body)
            return str(self._add_rule(rule_name, f'"[" space {body} "]" space'.replace("  ", " ")))
        return str(super().visit(schema, name))

    def _optional_rule(self, name: str, content: str) -> str:
        """`content` or nothing. As a rule: llama.cpp refuses `(...)?` over a group whose
        repetitions make more than 2000 rules."""
        return str(self._add_rule(name, content)) + "?"

    def _fresh(self, base: str) -> str:
        """A rule-name prefix no rule uses yet."""
        base = INVALID_RULE_CHARS_RE.sub("-", base)
        i = 0
        while any(key.startswith(f"{base}{i}-") for key in self._rules):
            i += 1
        return f"{base}{i}"

    def _add_format(self, name: str) -> str:
        rule = f"respd-{name}"
        pending = [rule]
        while pending:
            current = pending.pop()
            if current not in self._rules:
                self._rules[current] = _FORMAT_RULES[current]
                pending += re.findall(r"respd-[a-z0-9-]+", _FORMAT_RULES[current])
        return rule

    def _pattern_rule(self, schema: dict[str, Any], rule_name: str) -> str:
        bodies = []
        for start, end, items in _pattern_plan(schema, "#"):
            body = self._emit(_Seq(tuple(items)), rule_name)
            if not (start and end):  # a search: other text may stand around the match
                char = str(self._add_primitive("char", PRIMITIVE_RULES["char"]))
                around = [f"{char}*" if not start else "", body, f"{char}*" if not end else ""]
                body = " ".join(part for part in around if part) if body else f"{char}*"
            bodies.append(body)
        filled = [body for body in bodies if body]
        if len(filled) == len(bodies) == 1:
            content = filled[0]
        elif not filled:
            content = ""
        elif len(filled) < len(bodies):
            content = self._optional_rule(f"{rule_name}-part", " | ".join(filled))
        else:
            content = "(" + " | ".join(filled) + ")"
        return str(self._add_rule(rule_name, " ".join(['"\\""', content, '"\\"" space']).strip()))

    def _emit(self, node: _Node, base: str) -> str:
        """GBNF for a pattern node ("" for the empty string)."""
        if isinstance(node, _Set):
            expr = _set_expr(node.chars)
            return str(self._add_rule(f"{base}-char", expr)) if expr.startswith("(") else expr
        if isinstance(node, _Seq):
            parts: list[str] = []
            for part in (self._emit(item, base) for item in node.items):
                if parts and _LITERAL.fullmatch(parts[-1]) and _LITERAL.fullmatch(part):
                    parts[-1] = parts[-1][:-1] + part[1:]  # one literal: "ab", not "a" "b"
                elif part:
                    parts.append(part)
            return " ".join(parts)
        if isinstance(node, _Alt):
            options = [self._emit(option, base) for option in node.options]
            filled = [option for option in options if option]
            if not filled:
                return ""
            if len(filled) < len(options):
                return self._optional_rule(f"{base}-part", " | ".join(filled))
            return "(" + " | ".join(filled) + ")"
        if isinstance(node, _Rep):
            item = self._emit(node.item, base)
            if not item or node.hi == 0:
                return ""
            if not _ATOM.fullmatch(item):
                item = str(self._add_rule(f"{base}-part", item))
            return _repeat(item, node.lo, node.hi)
        return ""

    def _add_primitive(self, name: str, rule: BuiltinRule) -> str:
        if name == "char" or rule is PRIMITIVE_RULES["char"]:
            rule = _SAFE_CHAR
        return str(super()._add_primitive(name, rule))


def _literal(text: str) -> str:
    """A GBNF string literal; empty text is an empty sequence, not `""`."""
    if not text:
        return ""
    escaped = (
        text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    )
    return f'"{escaped}"'


class GrammarBuilder:
    """Collects rules for one request's grammar; `build` names the root alternatives."""

    def __init__(self) -> None:
        self._conv = _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)

    def schema_rule(self, schema: dict[str, Any], name: str) -> str:
        check_schema_for_grammar(schema)
        schema = copy.deepcopy(schema)
        try:
            schema = self._conv.resolve_refs(schema, name)
            return str(self._conv.visit(schema, name))
        except SchemaRejected:
            raise
        except (AssertionError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise SchemaRejected(f"the schema cannot be turned into a grammar ({exc})") from exc

    def calls_rule(
        self, fmt: ToolFormat, tools: Sequence[ToolDefinition], max_calls: int | None
    ) -> str:
        """One or more calls (at most `max_calls`) to the given functions, in `fmt`."""
        alternatives = []
        for i, tool in enumerate(tools):
            args = self.schema_rule(tool.parameters or NO_PARAMETERS, f"fn{i}-args")
            head = _literal(f'{{"name": {json.dumps(tool.name)}, "{fmt.args_key}": ')
            alternatives.append(self._add(f"fn{i}-call", f'{head} {args} "}}"'))
        call = self._add("tool-call", " | ".join(alternatives))
        item = self._add(
            "tool-item", f"{_literal(fmt.call_open)} {call} {_literal(fmt.call_close)}"
        )
        more = f"{_literal(fmt.separator)} {item}"
        if max_calls is None:
            body = f"{item} ({more})*"
        elif max_calls <= 1:
            body = item
        else:
            body = f"{item} {_repeat(f'({more})', 0, max_calls - 1)}"
        return self._add(
            "tool-calls", f"{_literal(fmt.list_open)} {body} {_literal(fmt.list_close)}"
        )

    def _add(self, name: str, rule: str) -> str:
        return str(self._conv._add_rule(name, " ".join(rule.split())))

    def build(self, *alternatives: str) -> str:
        self._conv._add_rule("root", " | ".join(alternatives))
        return str(self._conv.format_grammar())


def compile_constraint(
    constraint: Constraint,
    fmt: ToolFormat | None,
    *,
    reasoning: ReasoningStyle | None = None,
    reasoning_open: bool = False,
    effort: str | None = None,
) -> str:
    """The GBNF grammar of `constraint`: calls in the family's format, the answer schema,
    or either; preceded by the rest of an open thinking block when the prompt primes one."""
    builder = GrammarBuilder()
    calls = None
    if constraint.calls is not None:
        if fmt is None:
            raise ConstraintError("this model has no tool-call format", "calls")
        try:
            calls = builder.calls_rule(fmt, constraint.calls.tools, constraint.calls.max_calls)
        except SchemaRejected as exc:
            raise ConstraintError(
                f"a tool's parameters cannot be enforced: {exc}", "calls"
            ) from exc
    answer = None
    if constraint.answer is not None:
        try:
            answer = builder.schema_rule(constraint.answer, "answer")
        except SchemaRejected as exc:
            raise ConstraintError(str(exc), "answer") from exc
    grammar = builder.build(*[rule for rule in (calls, answer) if rule is not None])
    if reasoning is not None and reasoning_open and not reasoning.answer_headers:
        chars = THINKING_CHARS.get((effort or "").strip().lower(), DEFAULT_THINKING_CHARS)
        grammar = reasoning_first_grammar(grammar, reasoning.close, chars)
    return grammar


def reasoning_first_grammar(grammar: str, close: str, max_chars: int) -> str:
    """`grammar` preceded by the rest of a thinking block the prompt opened: 1 to
    `max_chars` characters of thinking (starting with a non-space, never containing the
    close marker's first character), the close marker, a little whitespace, then the
    answer `grammar` describes. Without this, a constrained answer on a template that
    primes an open `<think>` would be written inside the thinking, never read as the
    answer. (gpt-oss's channels are left unconstrained before the answer.)"""
    c = close[0]
    c = "\\" + c if c in "[]\\^-" else c
    rules = [
        f"root ::= respd-think {_literal(close)} respd-think-gap respd-answer",
        f"respd-think ::= [^{c} \\t\\n\\r] {_repeat(f'[^{c}]', 0, max(0, max_chars - 1))}".strip(),
        "respd-think-gap ::= [ \\n]{0,2}",
    ]
    answer = re.sub(r"^root ::=", "respd-answer ::=", grammar, count=1, flags=re.MULTILINE)
    return "\n".join([*rules, answer])
