"""Constraints → GBNF grammars for llama.cpp's grammar sampler.

Forced tool calls and JSON-Schema answers are enforced while sampling: the grammar only
admits well-formed output whose JSON validates against the schema. `compile_constraint`
builds a request's grammar with a `GrammarBuilder`: calls in the model family's
`ToolFormat` (which gives the wrappers around calls: `<tool_call>` tags, `[TOOL_CALLS]`,
...), the answer schema, or either, preceded by the rest of an open thinking block when the
prompt primes one (`reasoning_first_grammar`).

The schema rules, and the subset of valid values they admit where that is not all of them,
are described in the modules:

- `converter`: the schema check (`check_schema_for_grammar`: a schema the grammar cannot
  enforce is refused up front, not silently loosened) and the converter, llama-cpp-python's
  with fixes and rules of its own for the keywords below.
- `numbers`: `minimum`, `maximum`, `exclusive*` and `multipleOf`.
- `patterns`: `pattern` (an ECMA-262 subset), and `minLength`/`maxLength` beside it.
- `formats`: the enforced string `format`s.
- `repetition`: `minLength`/`maxLength`/`minItems`/`maxItems` and a pattern's counts as
  repetitions llama.cpp holds, and the largest count the grammar takes.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from typing import Any

from respd.engines.base import ToolDefinition
from respd.engines.constraints import (
    NO_PARAMETERS,
    Constraint,
    ConstraintError,
    SchemaRejected,
)
from respd.engines.families.reasoning import ReasoningStyle
from respd.engines.families.tools import ToolFormat
from respd.engines.llamacpp.grammar.converter import Converter, check_schema_for_grammar
from respd.engines.llamacpp.grammar.numbers import (
    NUMBER_FRACTION_DIGITS,
    NUMBER_INTEGER_DIGITS,
    integer_bounds,
    integer_range_rule,
    number_bounds,
)
from respd.engines.llamacpp.grammar.repetition import repeat as _repeat

__all__ = [
    "DEFAULT_THINKING_CHARS",
    "NUMBER_FRACTION_DIGITS",
    "NUMBER_INTEGER_DIGITS",
    "THINKING_CHARS",
    "GrammarBuilder",
    "_repeat",
    "check_schema_for_grammar",
    "compile_constraint",
    "integer_bounds",
    "integer_range_rule",
    "number_bounds",
    "reasoning_first_grammar",
]

# How much thinking a constrained answer may be preceded by, in characters, per effort.
THINKING_CHARS = {"minimal": 128, "low": 512, "medium": 2048, "high": 8192}
DEFAULT_THINKING_CHARS = 2048


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
        self._conv = Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)

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
