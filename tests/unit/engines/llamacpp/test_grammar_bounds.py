"""Integer bounds in JSON Schemas become digit-range grammar rules: property-based, the rule
admits exactly the integers in range (written as JSON writes them, no leading zeros), and
every form of the bound keywords is read; other numbers' bounds stay a named refusal."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from respd.engines.constraints import SchemaRejected
from respd.engines.llamacpp.grammar import (
    GrammarBuilder,
    check_schema_for_grammar,
    integer_bounds,
    integer_range_rule,
)

BOUND = st.one_of(st.none(), st.integers(-(10**6), 10**6))


def as_regex(rule: str) -> re.Pattern[str]:
    """The GBNF expression as a Python regex (it only uses literals, classes, `*`, `|`)."""
    return re.compile(re.sub(r'"([^"]*)"', lambda m: re.escape(m.group(1)), rule).replace(" ", ""))


@given(lo=BOUND, hi=BOUND, n=st.integers(-(10**7), 10**7))
def test_the_rule_admits_exactly_the_range(lo: int | None, hi: int | None, n: int) -> None:
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    pattern = as_regex(integer_range_rule(lo, hi))
    inside = (lo is None or n >= lo) and (hi is None or n <= hi)
    assert bool(pattern.fullmatch(str(n))) == inside, (lo, hi, n)
    if n > 0:
        assert not pattern.fullmatch("0" + str(n))  # JSON has no leading zeros
    assert not pattern.fullmatch("-0")


@pytest.mark.parametrize(
    ("schema", "bounds"),
    [
        ({"minimum": 1, "maximum": 10}, (1, 10)),
        ({"exclusiveMinimum": 0, "exclusiveMaximum": 5}, (1, 4)),
        ({"minimum": 0.5, "maximum": 9.5}, (1, 9)),
        ({"minimum": 3, "exclusiveMinimum": True}, (4, None)),
        ({"maximum": -2, "exclusiveMaximum": True}, (None, -3)),
        ({"minimum": 2, "exclusiveMinimum": 4}, (5, None)),
    ],
)
def test_bound_keywords(schema: dict[str, object], bounds: tuple[int | None, int | None]) -> None:
    assert integer_bounds({"type": "integer", **schema}) == bounds


def test_what_cannot_be_enforced_is_refused_by_name() -> None:
    with pytest.raises(SchemaRejected, match="'minimum' at # can be enforced only with a 'type'"):
        check_schema_for_grammar({"minimum": 0})
    with pytest.raises(SchemaRejected, match="no value"):
        check_schema_for_grammar({"type": "integer", "minimum": 5, "maximum": 4})
    with pytest.raises(SchemaRejected, match=r"'multipleOf' at #/properties/x is 0\.5"):
        check_schema_for_grammar(
            {"type": "object", "properties": {"x": {"type": "integer", "multipleOf": 0.5}}}
        )
    with pytest.raises(SchemaRejected, match="finite"):
        check_schema_for_grammar({"type": "integer", "minimum": float("inf")})


def test_a_pydantic_model_with_bounds_builds_a_grammar() -> None:
    schema = {
        "type": "object",
        "properties": {
            "rating": {"type": "integer", "minimum": 1, "maximum": 10},
            "integer": {"type": "integer", "exclusiveMinimum": 0},
        },
        "required": ["rating", "integer"],
        "additionalProperties": False,
    }
    rule = GrammarBuilder().schema_rule(schema, "answer")
    assert rule
