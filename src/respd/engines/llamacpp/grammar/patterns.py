"""`pattern` as GBNF rules.

A regex subset is parsed into sets of characters, sequences, alternatives and repetitions,
then written as GBNF over the JSON text of the string. The subset is ECMA-262's: literals,
classes, `.`, `\\d \\w \\s` and their negations, groups, alternation, greedy or lazy
quantifiers, `^`/`$` at the ends. The string must contain a match, so an unanchored side
may hold any other text. Characters are written as JSON text (`"`, `\\` and control
characters escaped), from the Basic Multilingual Plane only; `.` matches no line terminator
(ECMA's). Shorthand classes admit their ASCII members only, so that engines with Unicode
classes (Python, Rust) agree. Lookarounds, backreferences, word boundaries and Unicode
property classes are refused.

`minLength`/`maxLength` with a `pattern` hold only where the pattern's lengths already fit,
or the pattern is anchored with one repetition of a single character class whose counts
can absorb the bounds (as in `^[a-z]+$`); otherwise they are refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from respd.engines.constraints import SchemaRejected
from respd.engines.llamacpp.grammar.repetition import MAX_REPETITION, check_bound

_PATTERN_BOUND = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
# Every quantifier of a pattern together: each copy is a symbol llama.cpp allocates.
MAX_PATTERN_REPETITION = 4 * MAX_REPETITION

_Ranges = tuple[tuple[int, int], ...]
_MAX_CODE = 0x10FFFF


def ranges(pairs: Iterable[tuple[int, int]]) -> _Ranges:
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
    return _complement(ranges(_complement(a) + _complement(b)))


def _minus(a: _Ranges, b: _Ranges) -> _Ranges:
    return _intersect(a, _complement(b))


_ASCII: _Ranges = ((0, 0x7F),)
_DIGITS: _Ranges = ((0x30, 0x39),)
WORD = ranges([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
_SPACE = ranges([(0x09, 0x0D), (0x20, 0x20)])
# Python's `\s` also holds \x1c-\x1f, which ECMA and Rust count as non-space.
_PY_SPACE = ranges([*_SPACE, (0x1C, 0x1F)])
# Shorthand classes: what the grammar admits for each (its ASCII members on which the
# regex engines agree: Python's and Rust's, which pydantic validates with, also hold other
# Unicode letters, digits and spaces), and, for negated classes, the ASCII characters any
# engine may count in it.
_SHORTHANDS: dict[str, tuple[_Ranges, _Ranges]] = {
    "d": (_DIGITS, _DIGITS),
    "D": (_minus(_ASCII, _DIGITS), _minus(_ASCII, _DIGITS)),
    "w": (WORD, WORD),
    "W": (_minus(_ASCII, WORD), _minus(_ASCII, WORD)),
    "s": (_SPACE, _PY_SPACE),
    "S": (_minus(_ASCII, _PY_SPACE), _minus(_ASCII, _SPACE)),
}
# `.` matches no line terminator in ECMA (Python and Rust exclude only "\n").
_DOT = _complement(ranges([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]))
# What the grammar writes as one character: the BMP without surrogates (in JavaScript an
# astral character is two units, which `.` and lengths would count differently).
_WRITABLE = ranges([(0, 0xD7FF), (0xE000, 0xFFFF)])
# Characters JSON text escapes; the rest are written as they are.
_ESCAPED = ranges([(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)])
_JSON_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n"}
_JSON_ESCAPES |= {0x0D: "\\r", 0x09: "\\t"}


@dataclass(frozen=True)
class Set:
    chars: _Ranges


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Rep:
    item: Node
    lo: int
    hi: int | None


@dataclass(frozen=True)
class _Anchor:
    end: bool


Node = Set | Seq | Alt | Rep | _Anchor


class _PatternError(Exception):
    """A construct of a pattern that the grammar cannot enforce; the message names it."""


_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")


class _PatternParser:
    """A recursive-descent parser for the regex subset (ECMA-262 syntax)."""

    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.i = 0

    def parse(self) -> Node:
        node = self._alternatives()
        if self.i < len(self.text):
            raise _PatternError("an unbalanced ')'")
        return node

    def _peek(self, ahead: int = 0) -> str:
        i = self.i + ahead
        return self.text[i] if i < len(self.text) else ""

    def _alternatives(self) -> Node:
        options = [self._sequence()]
        while self._peek() == "|":
            self.i += 1
            options.append(self._sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def _sequence(self) -> Node:
        items: list[Node] = []
        while self._peek() not in ("", "|", ")"):
            items.append(self._quantified(self._atom()))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def _atom(self) -> Node:
        c = self._peek()
        self.i += 1
        if c == "(":
            return self._group()
        if c == "[":
            return self._class()
        if c == ".":
            return Set(_DOT)
        if c in "^$":
            return _Anchor(end=c == "$")
        if c in "*+?":
            raise _PatternError(f"a quantifier '{c}' with nothing to repeat")
        if c == "{":
            raise _PatternError("a '{' that repeats nothing")
        if c == "\\":
            chars, _, _ = self._escape(in_class=False)
            return Set(chars)
        return Set(((ord(c), ord(c)),))

    def _group(self) -> Node:
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

    def _quantified(self, atom: Node) -> Node:
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
        return Rep(atom, lo, hi)

    def _class(self) -> Set:
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
            return Set(ranges(pairs))
        # Not in the class: with a shorthand in it, only ASCII characters no engine counts.
        chars = _complement(ranges(widest))
        return Set(_intersect(chars, _ASCII) if shorthand else chars)

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


def _items(node: Node) -> list[Node]:
    return list(node.items) if isinstance(node, Seq) else [node]


def _has_anchor(node: Node) -> bool:
    if isinstance(node, _Anchor):
        return True
    if isinstance(node, Seq):
        return any(map(_has_anchor, node.items))
    if isinstance(node, Alt):
        return any(map(_has_anchor, node.options))
    return isinstance(node, Rep) and _has_anchor(node.item)


def _lengths(node: Node) -> tuple[int, int | None]:
    """The fewest and most characters `node` matches (None: no most)."""
    if isinstance(node, Set):
        return 1, 1
    if isinstance(node, _Anchor):
        return 0, 0
    if isinstance(node, Seq):
        lo: int = 0
        hi: int | None = 0
        for item in node.items:
            a, b = _lengths(item)
            lo += a
            hi = None if hi is None or b is None else hi + b
        return lo, hi
    if isinstance(node, Alt):
        ends = [_lengths(option) for option in node.options]
        highs = [b for _, b in ends]
        return min(a for a, _ in ends), None if None in highs else max(b or 0 for b in highs)
    a, b = _lengths(node.item)
    if node.hi == 0:
        return 0, 0
    return node.lo * a, None if node.hi is None or b is None else node.hi * b


def _repetition(node: Node) -> int:
    """The symbols llama.cpp allocates for the pattern's bounded repetitions."""
    if isinstance(node, Seq):
        return sum(map(_repetition, node.items))
    if isinstance(node, Alt):
        return sum(map(_repetition, node.options))
    if isinstance(node, Rep):
        return max(node.lo, node.hi or 0) + _repetition(node.item)
    return 0


def _writable(node: Node) -> bool:
    """Whether every class holds a character the grammar can write."""
    if isinstance(node, Set):
        return bool(_intersect(node.chars, _WRITABLE))
    if isinstance(node, Seq):
        return all(map(_writable, node.items))
    if isinstance(node, Alt):
        return all(map(_writable, node.options))
    return not isinstance(node, Rep) or _writable(node.item)


# One alternative of a pattern: anchored at the start, anchored at the end, its items.
_Branch = tuple[bool, bool, list[Node]]


def pattern_plan(schema: dict[str, Any], path: str) -> list[_Branch]:
    """The branches of `schema`'s pattern, with `minLength`/`maxLength` folded in, or a
    `SchemaRejected` naming what cannot be enforced."""
    pattern = schema["pattern"]
    if not isinstance(pattern, str):
        raise SchemaRejected(f"'pattern' at {path} must be a string")
    for m in _PATTERN_BOUND.finditer(pattern):
        for bound in m.groups():
            if bound:
                check_bound(int(bound), "pattern", path)
    try:
        tree = _PatternParser(pattern).parse()
        branches: list[_Branch] = []
        for option in tree.options if isinstance(tree, Alt) else (tree,):
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
        if sum(_repetition(Seq(tuple(b[2]))) for b in branches) > MAX_PATTERN_REPETITION:
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
        a, b = _lengths(Seq(tuple(items)))
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
            if isinstance(rep, Rep) and isinstance(rep.item, Set):
                fixed = sum(a for i, (a, _) in enumerate(ends) if i != v)
                lo = max(rep.lo, low - fixed)
                hi = rep.hi if high is None else high - fixed
                if rep.hi is not None and hi is not None:
                    hi = min(hi, rep.hi)
                if hi is not None and lo > hi:
                    raise SchemaRejected(
                        f"'minLength'/'maxLength' and 'pattern' at {path} admit no string"
                    )
                return [(True, True, [*items[:v], Rep(rep.item, lo, hi), *items[v + 1 :]])]
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


def char_class(ranges: _Ranges, negated: bool = False) -> str:
    body = "".join(
        _class_char(a) if a == b else f"{_class_char(a)}-{_class_char(b)}" for a, b in ranges
    )
    return f"[{'^' if negated else ''}{body}]"


def _gbnf_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def set_expr(ranges: _Ranges) -> str:
    """GBNF for one character of `ranges`, as JSON text (escaped where JSON needs it)."""
    ranges = _intersect(ranges, _WRITABLE)
    plain = _minus(ranges, _ESCAPED)
    alternatives = []
    if len(plain) == 1 and plain[0][0] == plain[0][1]:
        alternatives.append(_gbnf_literal(chr(plain[0][0])))
    elif plain:
        outside = _complement(plain)
        shorter = len(outside) < len(plain)
        alternatives.append(char_class(outside, negated=True) if shorter else char_class(plain))
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
