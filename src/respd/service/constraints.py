"""JSON Schema → GBNF grammars for llama.cpp's grammar sampler.

Forced tool calls and `json_schema` / `json_object` answers are enforced while sampling:
the grammar only admits well-formed output whose JSON validates against the schema. Schema
conversion uses the converter llama-cpp-python ships (a port of llama.cpp's
`json_schema_to_grammar.py`) with one fix: string characters exclude the control characters
JSON forbids unescaped. The wrappers around calls (`<tool_call>` tags, `[TOOL_CALLS]`, ...)
come from the family's `ToolFormat`.

A schema the grammar cannot enforce is refused up front (`SchemaRejected`, a 400 naming the
keyword and its path) rather than silently loosened. Limits: a schema's JSON text at most
`MAX_SCHEMA_CHARS` characters, and at most `MAX_SCHEMA_DEPTH` nested levels of
properties/items.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from typing import Any

from llama_cpp.llama_grammar import PRIMITIVE_RULES, BuiltinRule, SchemaConverter

from respd.service.tool_formats import ToolFormat

MAX_SCHEMA_CHARS = 32_768
MAX_SCHEMA_DEPTH = 10

# Keywords that restrict values in ways a context-free grammar here does not enforce.
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
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minProperties",
        "maxProperties",
    }
)
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
# JSON strings may not hold raw control characters.
_HEX4 = " ".join(["[0-9a-fA-F]"] * 4)
_SAFE_CHAR = BuiltinRule(r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" ' + _HEX4 + ")", [])
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
ANY_OBJECT: dict[str, Any] = {"type": "object"}


class SchemaRejected(ValueError):
    """The schema cannot be enforced; the message says why and where."""


def check_schema(schema: Any) -> None:
    """Refuse schemas that are too large, too deep, or use keywords we cannot enforce."""
    if not isinstance(schema, dict):
        raise SchemaRejected("the schema must be a JSON object")
    if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
        raise SchemaRejected(f"the schema is larger than {MAX_SCHEMA_CHARS} characters of JSON")
    _walk(schema, "#", 0)


def _walk(schema: Any, path: str, depth: int) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise SchemaRejected(f"{path} must be a schema object")
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaRejected(f"{path} is nested deeper than {MAX_SCHEMA_DEPTH} levels")
    for key, value in schema.items():
        if key in UNSUPPORTED_KEYWORDS or (key == "uniqueItems" and value):
            raise SchemaRejected(f"the keyword '{key}' at {path} cannot be enforced")
    ref = schema.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#/")):
        raise SchemaRejected(f"only local '$ref's ('#/...') are supported, got {ref!r} at {path}")
    for key in _SCHEMA_MAPS:
        members = schema.get(key)
        if isinstance(members, dict):
            for name, sub in members.items():
                _walk(sub, f"{path}/{key}/{name}", depth + (key == "properties"))
    for key in _SCHEMA_LISTS:
        members = schema.get(key)
        if isinstance(members, list):
            for i, sub in enumerate(members):
                _walk(sub, f"{path}/{key}/{i}", depth + (key == "prefixItems"))
    for key in ("items", "additionalProperties"):
        sub = schema.get(key)
        if isinstance(sub, dict):
            _walk(sub, f"{path}/{key}", depth + 1)
        elif isinstance(sub, list):
            for i, s in enumerate(sub):
                _walk(s, f"{path}/{key}/{i}", depth + 1)


class _Converter(SchemaConverter):
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
        check_schema(schema)
        schema = copy.deepcopy(schema)
        try:
            schema = self._conv.resolve_refs(schema, name)
            return str(self._conv.visit(schema, name))
        except (AssertionError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise SchemaRejected(f"the schema cannot be turned into a grammar ({exc})") from exc

    def calls_rule(
        self,
        fmt: ToolFormat,
        tools: Sequence[tuple[str, dict[str, Any] | None]],
        max_calls: int | None,
    ) -> str:
        """One or more calls (at most `max_calls`) to the given functions, in `fmt`."""
        alternatives = []
        for i, (name, parameters) in enumerate(tools):
            args = self.schema_rule(parameters or NO_PARAMETERS, f"fn{i}-args")
            head = _literal(f'{{"name": {json.dumps(name)}, "{fmt.args_key}": ')
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


def reasoning_first_grammar(grammar: str, close: str, max_chars: int) -> str:
    """`grammar` preceded by the rest of a thinking block the prompt opened: 1 to
    `max_chars` characters of thinking (starting with a non-space, never containing the
    close marker's first character), the close marker, a little whitespace, then the
    answer `grammar` describes. Without this, a constrained answer on a template that
    primes an open `<think>` would be written inside the thinking, never read as the
    answer."""
    c = close[0]
    c = "\\" + c if c in "[]\\^-" else c
    rules = [
        f"root ::= respd-think {_literal(close)} respd-think-gap respd-answer",
        f"respd-think ::= [^{c} \\t\\n\\r] [^{c}]{{0,{max(0, max_chars - 1)}}}",
        "respd-think-gap ::= [ \\n]{0,2}",
    ]
    answer = re.sub(r"^root ::=", "respd-answer ::=", grammar, count=1, flags=re.MULTILINE)
    return "\n".join([*rules, answer])
