"""String `format`s and `pattern`s in JSON Schemas, checked with llama.cpp's own grammar
sampler: admitted strings are valid JSON whose value has the format or matches the pattern
(Python's `re`, and pydantic's Rust regex); valid values in the enforced subset are
admitted; what the grammar cannot enforce is a named `SchemaRejected`."""

from __future__ import annotations

import json
import re
import string
import uuid
from datetime import date, datetime, time
from pathlib import Path
from typing import Annotated

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import Field, TypeAdapter, ValidationError

from respd.engines.constraints import SchemaRejected
from respd.engines.llamacpp.grammar import (
    GrammarBuilder,
    _repeat,
    check_schema_for_grammar,
    reasoning_first_grammar,
)

from .grammar_oracle import Grammar, schema_grammar

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def text(value: str) -> str:
    """A string as JSON text, the way the grammar writes it (no \\u for printable text)."""
    return json.dumps(value, ensure_ascii=False)


def fmt(name: str) -> Grammar:
    return schema_grammar({"type": "string", "format": name})


def is_date(value: str) -> bool:
    try:
        date.fromisoformat(value)
    except ValueError:
        return False
    return True


@SETTINGS
@given(
    year=st.integers(0, 9999),
    month=st.integers(0, 13),
    day=st.integers(0, 32),
)
def test_dates_are_exactly_the_calendar(year: int, month: int, day: int) -> None:
    value = f"{year:04d}-{month:02d}-{day:02d}"
    assert fmt("date").admits(text(value)) == is_date(value), value


def test_date_edges() -> None:
    grammar = fmt("date")
    for good in ("2024-02-29", "2000-02-29", "1600-02-29", "0004-02-29", "2023-02-28"):
        assert grammar.admits(text(good)), good
    for bad in ("1900-02-29", "2023-02-29", "2024-04-31", "0000-01-01", "2024-1-01", "24-01-01"):
        assert not grammar.admits(text(bad)), bad


TIME = st.builds(
    "{:02d}:{:02d}:{:02d}{}{}".format,
    st.integers(0, 25),
    st.integers(0, 61),
    st.integers(0, 61),
    st.one_of(st.just(""), st.text("0123456789", min_size=0, max_size=8).map(".{}".format)),
    st.one_of(
        st.sampled_from(["", "Z", "z", "+00:00", "-05:30", "+23:59", "+24:00", "+05"]),
        st.builds(
            "{}{:02d}:{:02d}".format, st.sampled_from("+-"), st.integers(0, 25), st.integers(0, 61)
        ),
    ),
)


@SETTINGS
@given(value=TIME)
def test_admitted_times_and_date_times_parse(value: str) -> None:
    admitted = fmt("time").admits(text(value))
    if admitted:
        time.fromisoformat(value)
        TypeAdapter(time).validate_python(value)
    assert fmt("date-time").admits(text("2024-05-06T" + value)) == admitted
    if admitted:
        datetime.fromisoformat("2024-05-06T" + value)
        TypeAdapter(datetime).validate_json(text("2024-05-06T" + value))
    canonical = re.fullmatch(
        r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)", value
    )
    assert admitted == bool(canonical), value


def test_uuids() -> None:
    grammar = fmt("uuid")
    for _ in range(20):
        value = str(uuid.uuid4())
        assert grammar.admits(text(value)) and grammar.admits(text(value.upper()))
    for bad in ("123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g", ""):
        assert not grammar.admits(text(bad)), bad


# RFC 5321: a dot-atom local part of at most 64 characters, then a domain name of labels
# of letters, digits and inner hyphens; at most 254 characters.
ATEXT = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
EMAIL = re.compile(
    rf"(?={ATEXT}[^@]{{0,63}}@)({ATEXT}+)(\.{ATEXT}+)*"
    r"@([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}"
)
SUBSET = (
    rf"{ATEXT}{{1,15}}(\.{ATEXT}{{1,15}}){{0,3}}"
    r"@([A-Za-z0-9]([A-Za-z0-9-]{0,20}[A-Za-z0-9])?\.){1,4}[A-Za-z]{2,12}"
)


@SETTINGS
@given(value=st.from_regex(SUBSET, fullmatch=True))
def test_emails_in_the_subset_are_admitted(value: str) -> None:
    assert fmt("email").admits(text(value)), value
    assert EMAIL.fullmatch(value) and len(value) <= 254


@SETTINGS
@given(value=st.text(string.ascii_letters + string.digits + ".@-_+'\"\\ ", max_size=30))
def test_admitted_emails_are_addresses(value: str) -> None:
    if fmt("email").admits(text(value)):
        assert EMAIL.fullmatch(value), value


def test_emails() -> None:
    grammar = fmt("email")
    for good in ("john.doe@example.com", "a@b.cd", "o'brien+tag@mail.co.uk", "X_1@a-b.io"):
        assert grammar.admits(text(good)), good
    for bad in ("a..b@x.com", ".a@x.com", "a.@x.com", "@x.com", "a@localhost", "a@-x.com"):
        assert not grammar.admits(text(bad)), bad
    for bad in ("a@x-.com", "a@x.c", "a@x.c0m", "a b@x.com", 'a"b@x.com', "a@x..com"):
        assert not grammar.admits(text(bad)), bad


def test_formats_keep_to_their_lengths_or_are_refused() -> None:
    assert schema_grammar({"type": "string", "format": "date", "maxLength": 10})
    assert schema_grammar({"type": "string", "format": "email", "maxLength": 254})
    with pytest.raises(SchemaRejected, match="'maxLength' at # cannot be enforced together"):
        check_schema_for_grammar({"type": "string", "format": "email", "maxLength": 50})
    with pytest.raises(SchemaRejected, match="'minLength' at # cannot be enforced together"):
        check_schema_for_grammar({"type": "string", "format": "time", "minLength": 10})
    # Beside a pattern (zod writes both), the pattern is enforced and the format is not.
    both = schema_grammar({"type": "string", "format": "date", "pattern": "^2"})
    assert both.admits(text("2024-01-31")) and both.admits(text("2x"))
    assert not both.admits(text("1999-01-31"))


def test_other_formats_are_annotations() -> None:
    grammar = schema_grammar({"type": "string", "format": "uri", "maxLength": 12})
    assert grammar.admits(text("not a uri"))
    assert not grammar.admits(text("far too long for it"))
    nullable = schema_grammar({"type": ["string", "null"], "format": "date"})
    assert nullable.admits("null") and nullable.admits(text("2024-01-31"))
    assert not nullable.admits(text("2024-01-32"))


# Patterns as pydantic (`Field(pattern=...)`), zod (`.regex()`) and hand-written schemas
# have them: anchored or not, with classes, shorthands, groups and quantifiers.
PATTERNS = [
    r"^[A-Z]{3}-\d{4}$",
    r"^\d{3}-\d{3}-\d{4}$",
    r"^[a-z0-9_-]{3,16}$",
    r"^\+?[1-9]\d{1,14}$",
    r"^#?([a-fA-F0-9]{6}|[a-fA-F0-9]{3})$",
    r"^(?:[01]\d|2[0-3]):[0-5]\d$",
    r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$",
    r"^\S+$",
    r"^[\w.-]+$",
    r"abc",
    r"^v\d+",
    r"\.(png|jpe?g)$",
    r'^[^"\\]*"[^"]*$',
    r"^\W*$",
    r"^(ab|cd)*e?$",
    r"^(?<word>[a-z]+) \d*?$",
    r"^[\t\n ]{2}x$",
    r"^.{2,4}$",
    r"^\u00e9[\x41-\x43]$",
    r"",
    r"^$",
]
CHARS = st.characters(codec="utf-8", exclude_categories=["Cs"], max_codepoint=0xFFFF)


def python(pattern: str) -> str:
    """The pattern in Python's syntax, `$` only at the very end as in ECMA-262."""
    return re.sub(r"\$$", r"\\Z", pattern.replace("(?<word>", "(?P<word>"))


def matches(pattern: str, value: str) -> bool:
    return re.search(python(pattern), value) is not None


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(SETTINGS, max_examples=max(5, SETTINGS.max_examples // 3))  # times 30 patterns
@given(data=st.data())
def test_patterns(pattern: str, data: st.DataObject) -> None:
    grammar = schema_grammar({"type": "string", "pattern": pattern})
    pydantic = TypeAdapter(Annotated[str, Field(pattern=pattern)])
    # Complete on ASCII text: Python's shorthands also hold other letters and digits,
    # which the grammar leaves out; DEL is written as "\u007f" where JSON allows it raw.
    extra = "é" if "\\u00e9" in pattern else ""  # a literal, not in a shorthand class
    ascii_text = st.characters(
        max_codepoint=0x7E, include_characters=extra, exclude_characters="\r"
    )  # and no "\r", which ECMA's `.` does not match (Python's does)
    value = data.draw(st.from_regex(python(pattern), alphabet=ascii_text))
    assert grammar.admits(text(value)), (pattern, value)
    # Sound on any text: mutate a match, or draw freely.
    drawn = data.draw(st.text(CHARS, max_size=12))
    cut = data.draw(st.integers(0, len(value)))
    for candidate in (drawn, value[:cut] + drawn + value[cut:], value[:cut], value + drawn):
        as_json = text(candidate)
        if grammar.admits(as_json):
            assert json.loads(as_json) == candidate
            assert matches(pattern, candidate), (pattern, candidate)
            pydantic.validate_python(candidate)


def test_a_pydantic_pattern() -> None:
    grammar = schema_grammar(
        TypeAdapter(Annotated[str, Field(pattern=r"^[A-Z]{3}-\d{4}$")]).json_schema()
    )
    assert grammar.admits('"ABC-1234"')
    for bad in ("AB-1234", "ABC-12345", "abc-1234", "ABC-12a4", "ABC_1234", " ABC-1234"):
        assert not grammar.admits(text(bad)), bad


def test_pattern_characters_are_written_as_json() -> None:
    grammar = schema_grammar({"type": "string", "pattern": r'^a"\\.$'})
    assert grammar.admits(r'"a\"\\\t"') and grammar.admits(r'"a\"\\x"')
    assert not grammar.admits(r'"a\"\\\n"')  # `.` is no line terminator
    assert not grammar.admits('"a"\\x"')  # an unescaped quote would end the string
    any_but_a = schema_grammar({"type": "string", "pattern": "^[^a]$"})
    for admitted in (r'"\""', r'"\\"', r'"\n"', r'"\u0001"', r'"\u001F"', '"é"', '"b"'):
        assert any_but_a.admits(admitted), admitted
    for refused in ('"a"', '"\n"', '"""', '"\\"', r'"\u0061"'):
        assert not any_but_a.admits(refused), refused


@pytest.mark.parametrize(
    ("pattern", "construct"),
    [
        (r"^(?=.*\d)\w+$", "a lookaround"),
        (r"^\w+(?!x)$", "a lookaround"),
        (r"(?<=a)b", "a lookaround"),
        (r"^(a)\1$", r"a backreference '\\1'"),
        (r"^(?<x>a)\k<x>$", "a named backreference"),
        (r"\bword\b", "a word boundary"),
        (r"^\p{L}+$", "a Unicode property class"),
        (r"(?i)abc", r"the group syntax '\(\?i\)'"),
        (r"(?P<x>a)", r"the group syntax '\(\?P<'"),
        (r"[[:alpha:]]", "'\\[:' inside a class"),
        (r"[a-z&&[^aeiou]]", "'&&' inside a class"),
        (r"(abc", r"an unbalanced '\('"),
        (r"abc)", r"an unbalanced '\)'"),
        (r"[abc", r"an unbalanced '\['"),
        (r"a{2,1}", r"the repetition '\{2,1\}' \(its maximum is below its minimum\)"),
        (r"a{,3}", "a '\\{' that is not a repetition"),
        (r"a**", "a quantifier on a quantifier"),
        (r"*a", r"a quantifier '\*' with nothing to repeat"),
        (r"a^b", r"an anchor \('\^' or '\$'\) inside the pattern"),
        (r"a(^b)", "an anchor"),
        (r"[]a]", "an empty class"),
        (r"\d\z", r"the escape '\\z'"),
        (r"^\ud83d$", "the surrogate escape"),
        ("\\", "a trailing"),
    ],
)
def test_unsupported_patterns_are_refused_by_name(pattern: str, construct: str) -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": pattern}}}
    with pytest.raises(
        SchemaRejected, match=f"the 'pattern' at #/properties/code uses {construct}"
    ):
        check_schema_for_grammar(schema)


@SETTINGS
@given(pattern=st.text("ab.|()[]{}^$*+?\\-,0123dwsSbBk<>=!:", max_size=12))
def test_any_pattern_is_enforced_or_refused(pattern: str) -> None:
    """No pattern gets past the check into a grammar llama.cpp cannot parse, or raises
    anything but `SchemaRejected`; what is admitted matches."""
    schema = {"type": "string", "pattern": pattern}
    try:
        check_schema_for_grammar(schema)
    except SchemaRejected:
        return
    builder = GrammarBuilder()
    grammar = Grammar(builder.build(builder.schema_rule(schema, "answer")))
    try:
        compiled = re.compile(pattern)
    except re.error:
        return
    for candidate in ("", "a", "b", "ab", "ba", "aab", "a.b", "-", "0", "d"):
        if grammar.admits(text(candidate)):
            assert compiled.search(candidate), (pattern, candidate)


def test_lengths_with_a_pattern() -> None:
    word = schema_grammar({"type": "string", "pattern": "^[a-z]+$", "maxLength": 5})
    assert word.admits('"abcde"') and word.admits('"a"')
    assert not word.admits('"abcdef"') and not word.admits('""')
    code = schema_grammar(
        {"type": "string", "pattern": r"^[A-Z]\w*$", "minLength": 3, "maxLength": 4}
    )
    assert code.admits('"Abc"') and code.admits('"Abcd"')
    assert not code.admits('"Ab"') and not code.admits('"Abcde"')
    fixed = schema_grammar(
        {"type": "string", "pattern": r"^[A-Z]{3}-\d{4}$", "minLength": 1, "maxLength": 8}
    )
    assert fixed.admits('"ABC-1234"')
    with pytest.raises(SchemaRejected, match="'maxLength' at # cannot be enforced together"):
        check_schema_for_grammar({"type": "string", "pattern": r"^\w+@\w+$", "maxLength": 9})
    with pytest.raises(SchemaRejected, match="'maxLength' at # cannot be enforced together"):
        check_schema_for_grammar({"type": "string", "pattern": "abc", "maxLength": 9})
    with pytest.raises(SchemaRejected, match="'minLength' at # cannot be enforced together"):
        check_schema_for_grammar(
            {"type": "string", "pattern": "^x[a-z]{5}$|^y$", "maxLength": 3, "minLength": 3}
        )
    with pytest.raises(SchemaRejected, match="admit no string"):
        check_schema_for_grammar({"type": "string", "pattern": "^ab[a-z]{0,3}$", "minLength": 6})


def test_a_type_list_keeps_the_other_keywords() -> None:
    nullable = schema_grammar({"type": ["string", "null"], "pattern": "^[a-z]{2}$"})
    assert nullable.admits("null") and nullable.admits('"ab"') and not nullable.admits('"abc"')
    short = schema_grammar({"type": ["string", "null"], "maxLength": 3})
    assert short.admits('"abc"') and not short.admits('"abcd"')
    choice = schema_grammar({"type": ["string", "null"], "enum": ["a", None]})
    assert choice.admits('"a"') and choice.admits("null") and not choice.admits('"b"')


def test_pydantic_validation_agrees_on_a_model() -> None:
    from pydantic import BaseModel

    class Booking(BaseModel):
        code: str = Field(pattern=r"^[A-Z]{3}-\d{4}$")
        day: date
        guest: str = Field(max_length=20)
        reference: uuid.UUID

    grammar = schema_grammar(Booking.model_json_schema())
    good = (
        '{"code": "ABC-1234", "day": "2024-02-29", "guest": "Ann",'
        ' "reference": "123e4567-e89b-12d3-a456-426614174000"}'
    )
    assert grammar.admits(good)
    Booking.model_validate_json(good)
    for bad in (good.replace("2024-02-29", "2023-02-29"), good.replace("ABC", "AB")):
        assert not grammar.admits(bad)
        with pytest.raises(ValidationError):
            Booking.model_validate_json(bad)


# Properties as zod 4 writes them (`zodTextFormat` of `z.object({...})`): formats with a
# pattern, bounds, `.int().multipleOf(5)` within the safe integers.
ZOD = json.loads((Path(__file__).parent / "zod_properties.json").read_text())
ZOD_VALUES = {
    "email": (["john.doe@example.com", "o'brien@mail.co.uk"], ["a..b@x.com", "a@x", "@x.io"]),
    "id": (["123e4567-e89b-12d3-a456-426614174000"], ["123e4567-e89b-02d3-a456-426614174000"]),
    "when": (["2024-02-29T12:30:00Z", "2024-01-01T00:00:00.5Z"], ["2023-02-29T12:30:00Z"]),
    "day": (["2024-02-29", "2000-02-29"], ["1900-02-29", "2024-04-31"]),
    "t": (["12:30", "23:59:59.25"], ["24:00", "12:60"]),
    "code": (["ABC-1234"], ["ABC-123"]),
    "cuid": (["cabc1234"], ["xabc1234", "cAB"]),
    "ipv4": (["192.168.0.1", "0.0.0.0"], ["256.1.1.1", "1.2.3"]),
}


@pytest.mark.parametrize("name", sorted(ZOD_VALUES))
def test_zod_string_schemas(name: str) -> None:
    grammar = schema_grammar(ZOD[name])
    good, bad = ZOD_VALUES[name]
    for value in good:
        assert grammar.admits(text(value)), value
        assert re.search(python(ZOD[name]["pattern"]), value)
    for value in bad:
        assert not grammar.admits(text(value)), value


def test_zod_numbers() -> None:
    assert schema_grammar(ZOD["n"]).admits("99.5")
    assert not schema_grammar(ZOD["n"]).admits("100.5")
    assert not schema_grammar(ZOD["p"]).admits("0")
    multiple = schema_grammar(ZOD["i"])
    assert multiple.admits("9007199254740990") and multiple.admits("-35")
    assert not multiple.admits("9007199254740995") and not multiple.admits("12")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083},  # HttpUrl
        {"type": "string", "minLength": 3000},
        {"type": "string", "minLength": 4096, "maxLength": 4096},
        {"type": "string", "pattern": r"^\d{2500}$"},
        {"type": "array", "items": {"type": "integer"}, "minItems": 2001, "maxItems": 4096},
    ],
)
def test_long_bounds_are_grammars_llama_cpp_takes(schema: dict[str, object]) -> None:
    schema_grammar(schema)  # llama.cpp refuses x{m,n} with m > 2000, and deep nesting


def test_lengths_and_item_counts() -> None:
    url = schema_grammar({"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083})
    assert url.admits(text("x" * 2083)) and not url.admits(text("x" * 2084))
    assert not url.admits('""')
    assert url.admits(text('"quoted"\n')) and not url.admits('"a\nb"')
    items = schema_grammar({"type": "array", "items": {"type": "integer"}, "minItems": 2})
    assert items.admits("[1, 2]") and items.admits("[1,2,3]") and not items.admits("[1]")
    few = schema_grammar({"type": "array", "items": {"type": "boolean"}, "maxItems": 2})
    assert few.admits("[]") and few.admits("[true, false]") and not few.admits("[true,true,true]")
    none = schema_grammar({"type": "array", "items": {"type": "boolean"}, "maxItems": 0})
    assert none.admits("[]") and not none.admits("[true]")
    many = schema_grammar({"type": "array", "items": {"type": "integer"}, "maxItems": 2500})
    assert many.admits("[]") and many.admits("[" + ",".join(["1"] * 2500) + "]")
    assert not many.admits("[" + ",".join(["1"] * 2501) + "]")
    optional = schema_grammar({"type": "string", "pattern": "^(a{0,2500}|b)?c$"})
    assert optional.admits('"c"') and optional.admits('"bc"')
    assert optional.admits(text("a" * 2500 + "c")) and not optional.admits(text("a" * 2501 + "c"))
    with pytest.raises(SchemaRejected, match="'minLength' and 'maxLength' at # admit no value"):
        check_schema_for_grammar({"type": "string", "minLength": 3, "maxLength": 2})


def test_a_pydantic_model_of_common_types() -> None:
    from decimal import Decimal
    from ipaddress import IPv4Address
    from typing import Literal

    from pydantic import BaseModel, HttpUrl

    class Order(BaseModel):
        amount: Decimal
        site: HttpUrl
        ip: IPv4Address
        size: int = Field(ge=0, lt=10, multiple_of=2)
        share: float = Field(gt=0, le=1)
        kind: Literal["a", "b"]
        tags: list[int] = Field(min_length=1, max_length=3)
        when: datetime
        at: time
        ref: uuid.UUID
        discount: float | None = Field(default=None, ge=0)

    grammar = schema_grammar(Order.model_json_schema())
    good = (
        '{"amount": "1.50", "site": "https://x.io", "ip": "1.2.3.4", "size": 8, "share": 0.25,'
        ' "kind": "a", "tags": [1, 2], "when": "2024-05-06T07:08:09Z", "at": "10:11:12+01:00",'
        ' "ref": "123e4567-e89b-12d3-a456-426614174000", "discount": null}'
    )
    assert grammar.admits(good)
    Order.model_validate_json(good)
    for bad in ('"size": 7', '"share": 0', '"tags": []', '"at": "10:11:12"'):
        key = bad.split(":")[0]
        start = good.index(key)
        end = good.index(",", start)
        assert not grammar.admits(good[:start] + bad + good[end:]), bad


# Each example feeds thousands of characters: a sixth of the profile's examples (25 thorough).
@settings(SETTINGS, max_examples=max(1, SETTINGS.max_examples // 6))
@given(lo=st.integers(0, 4300), extra=st.one_of(st.none(), st.integers(0, 4300)))
def test_repetitions_hold_their_counts(lo: int, extra: int | None) -> None:
    """llama.cpp takes no count above 2000 and does not hold a larger maximum (it admits
    twice as many), so larger counts are split into runs."""
    hi = None if extra is None else lo + extra
    grammar = Grammar(f'root ::= "<" {_repeat("[a-z]", lo, hi)} ">"')
    for n in {
        0,
        1,
        lo - 1,
        lo,
        lo + 1,
        1999,
        2000,
        2001,
        4001,
        *([hi - 1, hi, hi + 1] if hi else []),
    }:
        if n >= 0:
            inside = n >= lo and (hi is None or n <= hi)
            assert grammar.admits("<" + "x" * n + ">") == inside, (lo, hi, n)


def test_long_thinking_keeps_to_its_budget() -> None:
    grammar = Grammar(reasoning_first_grammar('root ::= "{}"', "</think>", 4500))
    assert grammar.admits("a" * 4500 + "</think>{}")
    assert not grammar.admits("a" * 4501 + "</think>{}")
