"""The input grammar of a `custom` tool, as a regular expression the engine can enforce.

A custom tool's call carries free text, not JSON. The model is shown it as a function
with one string argument, `input`; its `format` becomes that string's `pattern`, so the
engine's JSON-Schema grammar holds the text to it. A `regex` format is the pattern
itself. A `lark` format is translated: the subset of Lark that Codex and the Open
Responses examples use (rules and terminals, string and regex literals, `"a".."z"`
ranges, groups, `[optional]`, `? * +` and `~ n` / `~ n..m`, aliases, `%import common.X`)
has no recursion, so every rule can be inlined into one expression. A construct outside
that subset (recursion, `%ignore`, `%declare`, regex flags, templates, priorities on
alternatives) is refused by name, never silently loosened.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from respd.protocol.errors import InvalidRequest

# Lark's `common` library, as far as a grammar here may import it.
_COMMON = {
    "LF": r"\n",
    "CR": r"\r",
    "NEWLINE": r"(?:\r?\n)+",
    "WS_INLINE": r"[ \t]+",
    "WS": r"[ \t\f\r\n]+",
    "DIGIT": r"[0-9]",
    "HEXDIGIT": r"[a-fA-F0-9]",
    "INT": r"[0-9]+",
    "SIGNED_INT": r"[+-]?[0-9]+",
    "DECIMAL": r"(?:[0-9]+\.[0-9]*|\.[0-9]+)",
    "NUMBER": r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)",
    "LCASE_LETTER": r"[a-z]",
    "UCASE_LETTER": r"[A-Z]",
    "LETTER": r"[a-zA-Z]",
    "WORD": r"[a-zA-Z]+",
    "CNAME": r"[a-zA-Z_][a-zA-Z0-9_]*",
    "ESCAPED_STRING": r'"(?:[^"\\\n]|\\.)*"',
}
# The longest expression a grammar may inline to: past it the grammar is too large to hold.
MAX_EXPRESSION = 20_000
_REGEX_SPECIAL = set("\\^$.|?*+()[]{}/")


class LarkRejected(ValueError):
    """A Lark grammar outside the subset; the message names the construct."""


def regex_literal(text: str) -> str:
    """`text` matched verbatim, written in the ECMA syntax the pattern grammar reads."""
    out = []
    for ch in text:
        if ch in _REGEX_SPECIAL:
            out.append("\\" + ch)
        elif ch == "\n":
            out.append(r"\n")
        elif ch == "\t":
            out.append(r"\t")
        elif ch == "\r":
            out.append(r"\r")
        elif ord(ch) < 0x20:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t]+|//[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regex>/(?:[^/\\\n]|\\.)+/[imsuxl]*)
  | (?P<range>\.\.)
  | (?P<arrow>->)
  | (?P<name>[!?]?[A-Za-z_][A-Za-z0-9_]*(?:\.\d+)?)
  | (?P<number>\d+)
  | (?P<op>[()\[\]|?*+~])
    """,
    re.VERBOSE,
)


@dataclass
class _Token:
    kind: str
    text: str


def _tokens(body: str, where: str) -> list[_Token]:
    out, i = [], 0
    while i < len(body):
        m = _TOKEN.match(body, i)
        if m is None:
            raise LarkRejected(f"unreadable text {body[i : i + 12]!r} in {where}")
        i = m.end()
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append(_Token(kind, m.group()))
    return out


class _Expansion:
    """One definition's right-hand side, read into a regular expression; names stay as
    `\x00name\x00` placeholders until every definition is known."""

    def __init__(self, tokens: list[_Token], where: str) -> None:
        self.tokens = tokens
        self.i = 0
        self.where = where

    def _peek(self) -> _Token | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def parse(self) -> str:
        out = self._alternatives()
        if self._peek() is not None:
            raise LarkRejected(f"an unexpected {self.tokens[self.i].text!r} in {self.where}")
        return out

    def _alternatives(self) -> str:
        options = [self._sequence()]
        while (t := self._peek()) is not None and t.text == "|":
            self.i += 1
            options.append(self._sequence())
        return options[0] if len(options) == 1 else "(?:" + "|".join(options) + ")"

    def _sequence(self) -> str:
        items = []
        while (t := self._peek()) is not None and t.text not in ("|", ")", "]"):
            if t.kind == "arrow":  # `-> alias` names the tree node; the text is unchanged
                self.i += 1
                alias = self._peek()
                if alias is None or alias.kind != "name":
                    raise LarkRejected(f"an alias '->' without a name in {self.where}")
                self.i += 1
                continue
            items.append(self._quantified(self._atom()))
        return "".join(items)

    def _atom(self) -> str:
        t = self._peek()
        assert t is not None
        self.i += 1
        if t.kind == "string":
            if t.text.endswith("i"):
                raise LarkRejected(f"the case-insensitive string {t.text} in {self.where}")
            text = _string(t.text, self.where)
            nxt = self._peek()
            if nxt is not None and nxt.kind == "range":
                self.i += 1
                end = self._peek()
                if end is None or end.kind != "string":
                    raise LarkRejected(f"a range '..' without an end in {self.where}")
                self.i += 1
                last = _string(end.text, self.where)
                if len(text) != 1 or len(last) != 1 or last < text:
                    raise LarkRejected(f"the range {t.text}..{end.text} in {self.where}")
                return f"[{regex_literal(text)}-{regex_literal(last)}]"
            return regex_literal(text) if len(text) <= 1 else f"(?:{regex_literal(text)})"
        if t.kind == "regex":
            body, _, flags = t.text[1:].rpartition("/")
            if flags:
                raise LarkRejected(f"the regex flags '{flags}' of {t.text} in {self.where}")
            return f"(?:{body})"
        if t.kind == "name":
            if t.text[0] in "!?" or "." in t.text:
                raise LarkRejected(f"the reference {t.text!r} in {self.where}")
            return f"\x00{t.text}\x00"
        if t.text in ("(", "["):
            close = ")" if t.text == "(" else "]"
            inner = self._alternatives()
            end = self._peek()
            if end is None or end.text != close:
                raise LarkRejected(f"an unbalanced {t.text!r} in {self.where}")
            self.i += 1
            return f"(?:{inner})" + ("?" if close == "]" else "")
        raise LarkRejected(f"an unexpected {t.text!r} in {self.where}")

    def _quantified(self, atom: str) -> str:
        t = self._peek()
        if t is None:
            return atom
        if t.text in ("?", "*", "+"):
            self.i += 1
            return f"(?:{atom}){t.text}"
        if t.text == "~":
            self.i += 1
            lo = hi = self._count("a repetition '~' without a count")
            if (r := self._peek()) is not None and r.kind == "range":
                self.i += 1
                hi = self._count("a repetition '~ n..' without an end")
            return f"(?:{atom}){{{lo},{hi}}}"
        return atom

    def _count(self, missing: str) -> str:
        t = self._peek()
        if t is None or t.kind != "number":
            raise LarkRejected(f"{missing} in {self.where}")
        self.i += 1
        return t.text


def _string(literal: str, where: str) -> str:
    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError) as exc:
        raise LarkRejected(f"the string {literal} in {where}") from exc
    if not isinstance(value, str) or not value:
        raise LarkRejected(f"the empty string {literal} in {where}")
    return value


def _definitions(grammar: str) -> dict[str, str]:
    """Each rule's and terminal's expansion, continuation lines (`| ...`) joined."""
    defs: dict[str, list[str]] = {}
    current: str | None = None
    for raw in grammar.splitlines():
        line = raw.strip()
        if not line or line.startswith("//"):
            continue
        if line.startswith("%"):
            parts = line.split()
            if parts[0] == "%import" and len(parts) >= 2:
                _import(parts[1:], line, defs)
                current = None
                continue
            raise LarkRejected(f"the directive {parts[0]!r}")
        if line.startswith("|") and current is not None:
            defs[current].append(line)
            continue
        m = re.match(r"([!?]?)([A-Za-z_][A-Za-z0-9_]*)(\.-?\d+)?(\{[^}]*\})?\s*:(.*)", line)
        if m is None:
            raise LarkRejected(f"the line {line[:40]!r}")
        if m[4]:
            raise LarkRejected(f"the template rule {m[2]!r}")
        current = m[2]
        if current in defs:
            raise LarkRejected(f"a second definition of {current!r}")
        defs[current] = [m[5]]
    return {name: " ".join(parts) for name, parts in defs.items()}


def _import(args: list[str], line: str, defs: dict[str, list[str]]) -> None:
    text = " ".join(args)
    m = re.fullmatch(r"common\.([A-Z_]+)(?:\s*->\s*([A-Za-z_]\w*))?", text)
    names: list[tuple[str, str]]
    if m:
        names = [(m[1], m[2] or m[1])]
    else:
        g = re.fullmatch(r"common\s*\(([^)]*)\)", text)
        if g is None:
            raise LarkRejected(f"the import {line!r} (only 'common' terminals can be imported)")
        names = [(n.strip(), n.strip()) for n in g[1].split(",") if n.strip()]
    for name, alias in names:
        if name not in _COMMON:
            raise LarkRejected(f"the import of common.{name}")
        defs[alias] = [f"/{_COMMON[name]}/"]


def lark_to_regex(grammar: str) -> str:
    """The whole language of `grammar` (from its `start` rule) as one anchored regex."""
    raw = _definitions(grammar)
    if "start" not in raw:
        raise LarkRejected("a grammar without a 'start' rule")
    parsed = {
        name: _Expansion(_tokens(body, f"'{name}'"), f"'{name}'").parse()
        for name, body in raw.items()
    }
    done: dict[str, str] = {}

    def inline(name: str, stack: tuple[str, ...]) -> str:
        if name in done:
            return done[name]
        if name in stack:
            raise LarkRejected(f"the recursive rule {name!r}")
        if name not in parsed:
            raise LarkRejected(f"the undefined name {name!r}")
        parts = parsed[name].split("\x00")
        out = "".join(
            inline(part, (*stack, name)) if i % 2 else part for i, part in enumerate(parts)
        )
        if len(out) > MAX_EXPRESSION:
            raise LarkRejected("a grammar too large to enforce")
        done[name] = f"(?:{out})"
        return done[name]

    return f"^{inline('start', ())}$"


def input_pattern(fmt: object, param: str) -> str | None:
    """The pattern a custom tool's `format` puts on its input; None: free text."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise InvalidRequest(
            f"Invalid type for '{param}': expected an object.", param=param, code="invalid_type"
        )
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind != "grammar":
        raise InvalidRequest(
            f"Invalid value for '{param}.type': expected 'text' or 'grammar', got {kind!r}.",
            param=f"{param}.type",
            code="invalid_value",
        )
    syntax, definition = fmt.get("syntax"), fmt.get("definition")
    if not isinstance(definition, str) or not definition.strip():
        raise InvalidRequest(
            f"Missing required parameter: '{param}.definition'.",
            param=f"{param}.definition",
            code="missing_required_parameter",
        )
    if syntax == "regex":
        return f"^(?:{definition})$"
    if syntax != "lark":
        raise InvalidRequest(
            f"Invalid value for '{param}.syntax': expected 'lark' or 'regex', got {syntax!r}.",
            param=f"{param}.syntax",
            code="invalid_value",
        )
    try:
        return lark_to_regex(definition)
    except LarkRejected as exc:
        raise InvalidRequest(
            f"The Lark grammar in '{param}.definition' cannot be enforced: it uses {exc}.",
            param=f"{param}.definition",
            code="invalid_value",
        ) from exc
