"""Number bounds and `multipleOf` in JSON Schemas, checked with llama.cpp's own grammar
sampler: whatever the grammar admits validates (jsonschema, pydantic, exact decimals);
plain decimals in range are all admitted; edges of exclusive bounds are not."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Annotated, Any

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import Field, TypeAdapter

from respd.engines.constraints import SchemaRejected
from respd.engines.llamacpp.grammar import (
    NUMBER_FRACTION_DIGITS,
    NUMBER_INTEGER_DIGITS,
    check_schema_for_grammar,
    number_bounds,
)

from .grammar_oracle import schema_grammar

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Bounds as clients write them: small integers, decimals with a few digits, awkward floats.
BOUND = st.one_of(
    st.integers(-1000, 1000),
    st.decimals(-1000, 1000, places=3).map(float),
    st.sampled_from([0.1, 0.2, 1 / 3, 1e-20, -1e-20, 99.99999999999999, 2.5e-7]),
)


def decimal_text(sign: bool, whole: int, fraction: str) -> str:
    text = ("-" if sign else "") + str(whole)
    return text + ("." + fraction if fraction else "")


CANDIDATE = st.builds(
    decimal_text,
    st.booleans(),
    st.one_of(st.integers(0, 1100), st.integers(0, 10**17)),
    st.text("0123456789", max_size=NUMBER_FRACTION_DIGITS + 2),
)


def near(bound: float | int) -> list[str]:
    """Texts at and around a bound, where an unsound grammar would slip."""
    value = float(bound)
    out = [repr(value), str(bound), f"{value:.16f}", f"{value:.6f}"]
    for step in (math.inf, -math.inf):
        beside = math.nextafter(value, step)
        out += [repr(beside), f"{beside:.16f}", f"{Decimal(beside):.16f}"]
    out += [text + "0" for text in out if "." in text]
    return [t for t in out if "e" not in t and t not in ("-0.0", "-0", "inf", "-inf")]


def writable(text: str) -> bool:
    """Whether the grammar promises to admit `text` if its value is in range."""
    whole, _, fraction = text.lstrip("-").partition(".")
    negative_zero = text.startswith("-") and Decimal(text) == 0
    return (
        len(whole) <= NUMBER_INTEGER_DIGITS
        and len(fraction) <= NUMBER_FRACTION_DIGITS
        and not negative_zero
        and (whole == "0" or not whole.startswith("0"))
    )


def pydantic_type(schema: dict[str, Any]) -> TypeAdapter[float]:
    keys = {"minimum": "ge", "maximum": "le", "exclusiveMinimum": "gt", "exclusiveMaximum": "lt"}
    kwargs = {keys[k]: v for k, v in schema.items() if k in keys}
    return TypeAdapter(Annotated[float, Field(**kwargs)])


def exactly_within(schema: dict[str, Any], value: Decimal) -> bool:
    def exact(bound: float | int) -> Decimal:
        return Decimal(bound) if isinstance(bound, int) else Decimal(repr(bound))

    checks = {
        "minimum": lambda b: value >= exact(b),
        "maximum": lambda b: value <= exact(b),
        "exclusiveMinimum": lambda b: value > exact(b),
        "exclusiveMaximum": lambda b: value < exact(b),
    }
    return all(check(schema[key]) for key, check in checks.items() if key in schema)


@SETTINGS
@given(
    low=st.one_of(st.none(), BOUND),
    high=st.one_of(st.none(), BOUND),
    exclusive_low=st.booleans(),
    exclusive_high=st.booleans(),
    candidates=st.lists(CANDIDATE, max_size=12),
)
def test_admitted_numbers_are_in_range_and_numbers_in_range_are_admitted(
    low: float | None,
    high: float | None,
    exclusive_low: bool,
    exclusive_high: bool,
    candidates: list[str],
) -> None:
    assume(low is not None or high is not None)  # unbounded: the converter's own number rule
    schema: dict[str, Any] = {"type": "number"}
    if low is not None:
        schema["exclusiveMinimum" if exclusive_low else "minimum"] = low
    if high is not None:
        schema["exclusiveMaximum" if exclusive_high else "maximum"] = high
    try:
        lo, hi = number_bounds(schema)
    except SchemaRejected:
        assert low is not None and high is not None and low >= high
        return
    try:
        grammar = schema_grammar(schema)
    except SchemaRejected as exc:  # no decimal of 16 fraction digits in between
        assert "admit no number the grammar can write" in str(exc)
        assert lo is not None and hi is not None and hi - lo < Decimal("1e-16")
        return
    validator = jsonschema.Draft202012Validator(schema)
    adapter = pydantic_type(schema)
    texts = [*candidates, "0", "0.0", "-0", "-0.0", "1", "-1"]
    texts += [t for bound in (low, high) if bound is not None for t in near(bound)]
    for text in texts:
        admitted = grammar.admits(text)
        value = Decimal(text)
        if admitted:
            assert writable(text), text
            assert validator.is_valid(json.loads(text)), (schema, text)
            assert exactly_within(schema, value), (schema, text)
            adapter.validate_json(text)
        elif writable(text):
            inside = (lo is None or value >= lo) and (hi is None or value <= hi)
            assert not inside, (schema, text)


@pytest.mark.parametrize(
    ("schema", "admitted", "refused"),
    [
        (  # pydantic Field(ge=0.0, le=1.0)
            {"type": "number", "minimum": 0.0, "maximum": 1.0},
            ["0", "0.0", "0.5", "1", "1.0", "1.000", "0.0000000000000001"],
            ["-0", "-0.0", "1.0000000000000001", "1.5", "-0.1", "2", "1e0", "0.5e-1"],
        ),
        (  # zod z.number().positive()
            {"type": "number", "exclusiveMinimum": 0},
            ["0.0000000000000001", "1", "123456.789"],
            ["0", "0.0", "0.000", "-0", "-0.0", "-1"],
        ),
        (  # zod z.number().min(0).max(100)
            {"type": "number", "minimum": 0, "maximum": 100},
            ["0", "100", "100.0", "99.99", "42.5"],
            ["100.01", "-0.01", "101"],
        ),
        (
            {"type": "number", "exclusiveMinimum": -1.5, "exclusiveMaximum": 2.25},
            ["-1.4999", "-1", "0", "2.2499999", "2"],
            ["-1.5", "-1.50", "2.25", "2.250", "-2", "3"],
        ),
        (  # draft 4's boolean exclusiveMaximum
            {"type": "number", "maximum": 10, "exclusiveMaximum": True},
            ["9.5", "-3", "9.99999999999999"],
            ["10", "10.0", "11"],
        ),
        (
            {"type": ["number", "null"], "minimum": 0},
            ["null", "0", "3.14"],
            ["-3.14", '"0"'],
        ),
    ],
)
def test_number_bounds_at_their_edges(
    schema: dict[str, Any], admitted: list[str], refused: list[str]
) -> None:
    grammar = schema_grammar(schema)
    for text in admitted:
        assert grammar.admits(text), text
    for text in refused:
        assert not grammar.admits(text), text


def test_a_pydantic_model_with_float_bounds() -> None:
    from pydantic import BaseModel

    class Score(BaseModel):
        confidence: float = Field(ge=0.0, le=1.0)
        temperature: float = Field(gt=-273.15)
        ratio: float | None = Field(default=None, lt=1)

    grammar = schema_grammar(Score.model_json_schema())
    good = '{"confidence": 0.75, "temperature": -273.14, "ratio": 0.5}'
    assert grammar.admits(good)
    Score.model_validate_json(good)
    assert grammar.admits('{"confidence": 1, "temperature": 20, "ratio": null}')
    for bad in (
        '{"confidence": 1.01, "temperature": 20}',
        '{"confidence": 0.5, "temperature": -273.15}',
        '{"confidence": 0.5, "temperature": 0, "ratio": 1}',
    ):
        assert not grammar.admits(bad), bad


@SETTINGS
@given(
    k=st.one_of(st.integers(1, 40), st.sampled_from([97, 100, 250, 512, 1000])),
    low=st.one_of(st.none(), st.integers(-(10**6), 10**6)),
    span=st.one_of(st.none(), st.integers(0, 10**6)),
    numbers=st.lists(st.integers(-(10**7), 10**7), max_size=20),
)
def test_integer_multiples_are_exactly_admitted(
    k: int, low: int | None, span: int | None, numbers: list[int]
) -> None:
    schema: dict[str, Any] = {"type": "integer", "multipleOf": k}
    high = None if span is None else (low or 0) + span
    if low is not None:
        schema["minimum"] = low
    if high is not None:
        schema["maximum"] = high
    try:
        grammar = schema_grammar(schema)
    except SchemaRejected as exc:  # a range without multiples
        assert "admit no value" in str(exc)
        assert low is not None and high is not None and (high // k) * k < low
        return
    nearby = [(low or 0) + d for d in (-k, -1, 0, 1, k)] + [(high or 0) + d for d in (-1, 0, 1)]
    for n in [*numbers, *nearby, 0, k, -k, 10 * k + 1]:
        inside = (low is None or n >= low) and (high is None or n <= high)
        assert grammar.admits(str(n)) == (inside and n % k == 0), (schema, n)
    assert not grammar.admits("-0")
    assert not grammar.admits("0" + str(k))


def test_multiples_as_pydantic_writes_them() -> None:
    schema = TypeAdapter(Annotated[int, Field(multiple_of=5, ge=0)]).json_schema()
    grammar = schema_grammar(schema)
    assert [n for n in range(-20, 40) if grammar.admits(str(n))] == [0, 5, 10, 15, 20, 25, 30, 35]
    # Numbers with a whole-number divisor are written as integers.
    number = schema_grammar({"type": "number", "multipleOf": 2.0, "maximum": 7.5})
    assert [n for n in range(-4, 12) if number.admits(str(n))] == [-4, -2, 0, 2, 4, 6]
    assert not number.admits("4.0")


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "number", "multipleOf": 0.01}, "'multipleOf' at # is 0.01: the grammar enforces"),
        ({"type": "integer", "multipleOf": 9973}, "'multipleOf' at # is 9973: divisibility"),
        ({"type": "integer", "multipleOf": 0}, "'multipleOf' at # must be a positive number"),
        ({"type": "number", "minimum": 1e17}, "admit no number the grammar can write"),
        ({"type": "number", "minimum": 2, "exclusiveMaximum": 2}, "number bounds at # admit no"),
        ({"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 6}, "admit no value"),
        ({"maximum": 3}, "'maximum' at # can be enforced only with a 'type'"),
    ],
)
def test_what_cannot_be_enforced_is_refused_by_name(schema: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaRejected, match=message):
        check_schema_for_grammar(schema)


def test_a_large_prime_divisor_is_enforced_within_enumerable_bounds() -> None:
    grammar = schema_grammar(
        {"type": "integer", "multipleOf": 9973, "minimum": 0, "maximum": 10**6}
    )
    assert grammar.admits("997300") and grammar.admits("0")
    assert not grammar.admits("997301")
