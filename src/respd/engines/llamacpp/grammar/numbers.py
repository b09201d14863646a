"""Numeric bounds and `multipleOf` as GBNF rules.

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
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

from respd.engines.constraints import SchemaRejected

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


def _too_many_rules(k: int, path: str) -> SchemaRejected:
    """The refusal of a `multipleOf` whose divisibility grammar would be too large."""
    return SchemaRejected(
        f"'multipleOf' at {path} is {k}: divisibility by it takes more grammar rules than "
        f"can be enforced; bound the value with 'minimum' and 'maximum' to at most "
        f"{MAX_ENUMERATED} multiples"
    )


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
    refusal = _too_many_rules(k, path)
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
