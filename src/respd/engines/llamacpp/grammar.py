"""Constraints → GBNF grammars for llama.cpp's grammar sampler.

Forced tool calls and JSON-Schema answers are enforced while sampling: the grammar only
admits well-formed output whose JSON validates against the schema. Schema conversion uses
the converter llama-cpp-python ships (a port of llama.cpp's `json_schema_to_grammar.py`)
with one fix: string characters exclude the control characters JSON forbids unescaped.
The wrappers around calls (`<tool_call>` tags, `[TOOL_CALLS]`, ...) come from the model
family's `ToolFormat`.

Integer bounds (`minimum`, `maximum`, `exclusive*`) become digit-range rules, so a
`Field(ge=1, le=10)` answer can only be 1 to 10. A schema the grammar cannot enforce is
refused up front (`SchemaRejected`, a 400 naming the
keyword and its path) rather than silently loosened. Bounds are refused too when they are
larger than the grammar can hold: llama.cpp expands `x{m,n}` into n copies of `x`, so a
`maxLength` of 10^9 would take gigabytes before the first token.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Sequence
from typing import Any

from llama_cpp.llama_grammar import (
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
        "multipleOf",
        "minProperties",
        "maxProperties",
    }
)
# Numeric bounds: enforced for integers (a grammar of digit ranges); not for other numbers.
BOUND_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# Counts the grammar expands into that many rule copies.
REPETITION_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems")
MAX_REPETITION = 4096
_PATTERN_BOUND = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")

# How much thinking a constrained answer may be preceded by, in characters, per effort.
THINKING_CHARS = {"minimal": 128, "low": 512, "medium": 2048, "high": 8192}
DEFAULT_THINKING_CHARS = 2048

# JSON strings may not hold raw control characters.
_HEX4 = " ".join(["[0-9a-fA-F]"] * 4)
_SAFE_CHAR = BuiltinRule(r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" ' + _HEX4 + ")", [])


def check_schema_for_grammar(schema: Any) -> None:
    """Refuse schemas the grammar cannot enforce, before any grammar is built."""
    for path, node in check_schema(schema):
        for key, value in node.items():
            if key in UNSUPPORTED_KEYWORDS or (key == "uniqueItems" and value):
                raise SchemaRejected(f"the keyword '{key}' at {path} cannot be enforced")
            if key in REPETITION_KEYWORDS:
                _check_bound(value, key, path)
            if key in BOUND_KEYWORDS and node.get("type") != "integer":
                raise SchemaRejected(
                    f"the keyword '{key}' at {path} can be enforced on integers only"
                )
        if node.get("type") == "integer" and any(k in node for k in BOUND_KEYWORDS):
            integer_bounds(node, path)
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            for m in _PATTERN_BOUND.finditer(pattern):
                for bound in m.groups():
                    if bound:
                        _check_bound(int(bound), "pattern", path)


def _check_bound(value: Any, key: str, path: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaRejected(f"'{key}' at {path} must be a non-negative integer")
    if value > MAX_REPETITION:
        raise SchemaRejected(
            f"'{key}' at {path} is {value}, above the largest bound the grammar can enforce "
            f"({MAX_REPETITION})"
        )


def _number(value: Any, key: str, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise SchemaRejected(f"'{key}' at {path} must be a number")
    return float(value)


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


def integer_range_rule(lo: int | None, hi: int | None) -> str:
    """A GBNF expression for the JSON integers from `lo` to `hi` (None: unbounded)."""
    alternatives: list[list[str]] = []
    if lo is None or lo < 0:  # the negatives: "-" then their magnitude
        low_magnitude = 1 if hi is None or hi >= 0 else -hi
        high_magnitude = None if lo is None else -lo
        alternatives += [['"-"', *seq] for seq in _natural_range(low_magnitude, high_magnitude)]
    if hi is None or hi >= 0:
        alternatives += _natural_range(max(lo or 0, 0), hi)
    return "(" + " | ".join(" ".join(seq) for seq in alternatives) + ")"


class _Converter(SchemaConverter):
    def visit(self, schema: dict[str, Any], name: str) -> str:
        if schema.get("type") == "integer" and any(k in schema for k in BOUND_KEYWORDS):
            lo, hi = integer_bounds(schema)
            rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
            return str(self._add_rule(rule_name, integer_range_rule(lo, hi) + " space"))
        return str(super().visit(schema, name))

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
            body = f"{item} ({more}){{0,{max_calls - 1}}}"
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
        f"respd-think ::= [^{c} \\t\\n\\r] [^{c}]{{0,{max(0, max_chars - 1)}}}",
        "respd-think-gap ::= [ \\n]{0,2}",
    ]
    answer = re.sub(r"^root ::=", "respd-answer ::=", grammar, count=1, flags=re.MULTILINE)
    return "\n".join([*rules, answer])
