"""Enforced string `format`s as GBNF rules.

`date` (real calendar dates, years 0001-9999, leap years included), `time` (`hh:mm:ss`, up
to 6 fraction digits, then `Z` or `±hh:mm`), `date-time` (`<date>T<time>`), `uuid`
(8-4-4-4-12 hex digits) and `email` (dot-atom local part of up to 4 atoms of 1-15
characters, then 2 to 5 domain labels, the last alphabetic). Other formats, and any format
beside a `pattern` (zod writes both: a pattern for the format), are annotations, as JSON
Schema 2020-12 has them by default: not enforced.

`minLength`/`maxLength` with an enforced format hold only where the format's lengths
already fit; otherwise they are refused.
"""

from __future__ import annotations

from typing import Any

from respd.engines.constraints import SchemaRejected
from respd.engines.llamacpp.grammar.patterns import WORD, char_class, ranges

# Enforced string formats: GBNF rules (named so that no schema-derived rule clashes), and
# the fewest and most characters each admits.
FORMATS: dict[str, tuple[int, int]] = {
    "date": (10, 10),
    "time": (9, 21),
    "date-time": (20, 32),
    "uuid": (36, 36),
    "email": (6, 168),
}
_HEX = "[0-9a-fA-F]"
_LEAP_YY = '("0" [48] | [2468] [048] | [13579] [26])'
_EMAIL_ATEXT = char_class(ranges((ord(c), ord(c)) for c in "!#$%&'*+/=?^_`{|}~-") + WORD)
_ALNUM = "[0-9A-Za-z]"
FORMAT_RULES: dict[str, str] = {
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


def check_format(schema: dict[str, Any], path: str) -> None:
    """Refuse string lengths an enforced `format` would not keep."""
    name = schema.get("format")
    if name not in FORMATS or "pattern" in schema:
        return
    shortest, longest = FORMATS[name]
    if schema.get("minLength", 0) > shortest:
        key = "minLength"
    elif schema.get("maxLength", longest) < longest:
        key = "maxLength"
    else:
        return
    raise SchemaRejected(f"'{key}' at {path} cannot be enforced together with 'format': '{name}'")
