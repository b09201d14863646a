"""Attribute filters: every comparison and compound, missing keys, and each bad shape a 400
naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from respd.protocol.errors import InvalidRequest
from respd.service.vector_stores.filters import check_filter, matches

ATTRS = {"author": "ada", "year": 2021, "score": 4.5, "draft": False}


def cmp(kind: str, key: str, value: Any) -> dict[str, Any]:
    return {"type": kind, "key": key, "value": value}


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        (cmp("eq", "author", "ada"), True),
        (cmp("eq", "author", "bob"), False),
        (cmp("ne", "author", "bob"), True),
        (cmp("gt", "year", 2020), True),
        (cmp("gte", "year", 2021), True),
        (cmp("lt", "score", 4.5), False),
        (cmp("lte", "score", 4.5), True),
        (cmp("gt", "year", "2020"), False),  # no order across types
        (cmp("in", "author", ["bob", "ada"]), True),
        (cmp("nin", "author", ["bob", "ada"]), False),
        (cmp("eq", "draft", False), True),
        (cmp("eq", "draft", 0), False),  # booleans are not numbers
        (cmp("eq", "missing", "x"), False),
        (cmp("ne", "missing", "x"), True),
        (cmp("nin", "missing", ["x"]), True),
        ({"type": "and", "filters": [cmp("eq", "author", "ada"), cmp("gt", "year", 2021)]}, False),
        ({"type": "or", "filters": [cmp("eq", "author", "bob"), cmp("gte", "year", 2021)]}, True),
        (
            {
                "type": "and",
                "filters": [
                    {
                        "type": "or",
                        "filters": [cmp("eq", "author", "x"), cmp("eq", "draft", False)],
                    },
                    cmp("lt", "year", 2022),
                ],
            },
            True,
        ),
    ],
)
def test_filters_match_attributes(flt: dict[str, Any], expected: bool) -> None:
    assert matches(check_filter(flt), ATTRS) is expected


def test_no_filter_matches_everything() -> None:
    assert matches(None, {})


@pytest.mark.parametrize(
    ("flt", "param"),
    [
        ([], "filters"),
        ({"type": "like", "key": "a", "value": "b"}, "filters.type"),
        ({"type": "eq", "value": "b"}, "filters.key"),
        ({"type": "eq", "key": "a", "value": {"x": 1}}, "filters.value"),
        ({"type": "in", "key": "a", "value": "b"}, "filters.value"),
        ({"type": "and", "filters": []}, "filters.filters"),
        ({"type": "or", "filters": [{"type": "eq", "key": "a"}]}, "filters.filters[0].value"),
    ],
)
def test_bad_filters_name_their_field(flt: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_filter(flt)
    assert caught.value.param == param
