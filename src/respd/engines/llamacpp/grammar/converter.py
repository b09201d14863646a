"""JSON Schema → GBNF: the schema check and the converter.

Schema conversion uses the converter llama-cpp-python ships (a port of llama.cpp's
`json_schema_to_grammar.py`) with fixes: string characters exclude the control characters
JSON forbids unescaped, a `type` list keeps the node's other keywords on every branch, and
numeric bounds and `multipleOf` (`numbers`), `pattern` (`patterns`), `format` (`formats`)
and lengths and item counts (`repetition`) get rules of their own.

A schema the grammar cannot enforce is refused up front by `check_schema_for_grammar`
(`SchemaRejected`, a 400 naming the keyword and its path) rather than silently loosened.
"""

from __future__ import annotations

import re
from typing import Any

from llama_cpp.llama_grammar import (
    INVALID_RULE_CHARS_RE,
    PRIMITIVE_RULES,
    RESERVED_NAMES,
    BuiltinRule,
    SchemaConverter,
)

from respd.engines.constraints import SchemaRejected, check_schema
from respd.engines.llamacpp.grammar.formats import FORMAT_RULES, FORMATS, check_format
from respd.engines.llamacpp.grammar.numbers import numeric_rule
from respd.engines.llamacpp.grammar.patterns import Alt, Node, Rep, Seq, Set, pattern_plan, set_expr
from respd.engines.llamacpp.grammar.repetition import check_bound, repeat

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
        "minProperties",
        "maxProperties",
    }
)
# Numeric bounds: digit-range rules for integers, decimal-range rules for other numbers.
BOUND_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
NUMERIC_KEYWORDS = (*BOUND_KEYWORDS, "multipleOf")
# Counts the grammar expands into that many rule copies.
REPETITION_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems")

# JSON strings may not hold raw control characters.
_HEX4 = " ".join(["[0-9a-fA-F]"] * 4)
_SAFE_CHAR = BuiltinRule(r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" ' + _HEX4 + ")", [])


def _types(node: dict[str, Any]) -> set[str] | None:
    """The JSON types a schema node allows by its `type` (None: no `type`)."""
    value = node.get("type")
    if isinstance(value, str):
        return {value}
    if isinstance(value, list):
        return {t for t in value if isinstance(t, str)}
    return None


def check_schema_for_grammar(schema: Any) -> None:
    """Refuse schemas the grammar cannot enforce, before any grammar is built."""
    for path, node in check_schema(schema):
        for key, value in node.items():
            if key in UNSUPPORTED_KEYWORDS or (key == "uniqueItems" and value):
                raise SchemaRejected(f"the keyword '{key}' at {path} cannot be enforced")
            if key in REPETITION_KEYWORDS:
                check_bound(value, key, path)
        for low, high in (("minLength", "maxLength"), ("minItems", "maxItems")):
            if low in node and high in node and node[low] > node[high]:
                raise SchemaRejected(f"'{low}' and '{high}' at {path} admit no value")
        types = _types(node)
        numeric = [key for key in NUMERIC_KEYWORDS if key in node]
        if numeric and types is None:
            raise SchemaRejected(
                f"the keyword '{numeric[0]}' at {path} can be enforced only with a 'type' "
                "of 'integer' or 'number'"
            )
        if numeric and types is not None:
            for kind in ("integer", "number"):
                if kind in types:
                    numeric_rule(node, kind, "check", path)
        if types is None or "string" in types:
            if "pattern" in node:
                pattern_plan(node, path)
            check_format(node, path)


_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"')
_ATOM = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[A-Za-z0-9-]+')


class Converter(SchemaConverter):
    def visit(self, schema: dict[str, Any], name: str) -> str:
        rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
        if any(key in schema for key in ("$ref", "anyOf", "oneOf")):
            return str(super().visit(schema, name))
        types = schema.get("type")
        if "const" in schema or "enum" in schema:
            # The values are the rule; a `type` list would otherwise be visited first.
            return str(super().visit({k: v for k, v in schema.items() if k != "type"}, name))
        if isinstance(types, list):
            # Each type keeps the node's other keywords (bounds, lengths, properties, ...).
            alternatives = [
                self.visit({**schema, "type": t}, f"{name}{'-' if name else 'alternative-'}{i}")
                for i, t in enumerate(types)
            ]
            return str(self._add_rule(rule_name, " | ".join(alternatives)))
        if types in ("integer", "number") and any(k in schema for k in NUMERIC_KEYWORDS):
            prefix = self._fresh(f"{rule_name}-mod")
            expr, rules = numeric_rule(schema, types, prefix)
            self._rules.update(rules)
            return str(self._add_rule(rule_name, expr + " space"))
        formatted = schema.get("format") in FORMATS
        if types == "string" or (types is None and ("pattern" in schema or formatted)):
            if "pattern" in schema:
                return self._pattern_rule(schema, rule_name)
            if formatted:
                rule = self._add_format(schema["format"])
                return str(self._add_rule(rule_name, f'"\\"" {rule} "\\"" space'))
            if types == "string" and ("minLength" in schema or "maxLength" in schema):
                # Native repetitions: the converter nests one group per optional character,
                # which llama.cpp refuses beyond about a thousand (pydantic's HttpUrl: 2083).
                char = str(self._add_primitive("char", PRIMITIVE_RULES["char"]))
                chars = repeat(char, schema.get("minLength", 0), schema.get("maxLength"))
                return str(
                    self._add_rule(rule_name, f'"\\"" {chars} "\\"" space'.replace("  ", " "))
                )
        items = schema.get("items")
        if types in (None, "array") and isinstance(items, dict) and "prefixItems" not in schema:
            item = self.visit(items, f"{name}{'-' if name else ''}item")
            lo, hi = schema.get("minItems", 0), schema.get("maxItems")
            more = repeat(f'("," space {item})', max(lo - 1, 0), None if hi is None else hi - 1)
            body = f"{item} {more}".strip()
            if hi == 0:
                body = ""
            elif lo == 0:
                body = self._optional_rule(f"{rule_name}-items", body)
            return str(self._add_rule(rule_name, f'"[" space {body} "]" space'.replace("  ", " ")))
        return str(super().visit(schema, name))

    def _optional_rule(self, name: str, content: str) -> str:
        """`content` or nothing. As a rule: llama.cpp refuses `(...)?` over a group whose
        repetitions make more than 2000 rules."""
        return str(self._add_rule(name, content)) + "?"

    def _fresh(self, base: str) -> str:
        """A rule-name prefix no rule uses yet."""
        base = INVALID_RULE_CHARS_RE.sub("-", base)
        i = 0
        while any(key.startswith(f"{base}{i}-") for key in self._rules):
            i += 1
        return f"{base}{i}"

    def _add_format(self, name: str) -> str:
        rule = f"respd-{name}"
        pending = [rule]
        while pending:
            current = pending.pop()
            if current not in self._rules:
                self._rules[current] = FORMAT_RULES[current]
                pending += re.findall(r"respd-[a-z0-9-]+", FORMAT_RULES[current])
        return rule

    def _pattern_rule(self, schema: dict[str, Any], rule_name: str) -> str:
        bodies = []
        for start, end, items in pattern_plan(schema, "#"):
            body = self._emit(Seq(tuple(items)), rule_name)
            if not (start and end):  # a search: other text may stand around the match
                char = str(self._add_primitive("char", PRIMITIVE_RULES["char"]))
                around = [f"{char}*" if not start else "", body, f"{char}*" if not end else ""]
                body = " ".join(part for part in around if part) if body else f"{char}*"
            bodies.append(body)
        filled = [body for body in bodies if body]
        if len(filled) == len(bodies) == 1:
            content = filled[0]
        elif not filled:
            content = ""
        elif len(filled) < len(bodies):
            content = self._optional_rule(f"{rule_name}-part", " | ".join(filled))
        else:
            content = "(" + " | ".join(filled) + ")"
        return str(self._add_rule(rule_name, " ".join(['"\\""', content, '"\\"" space']).strip()))

    def _emit(self, node: Node, base: str) -> str:
        """GBNF for a pattern node ("" for the empty string)."""
        if isinstance(node, Set):
            expr = set_expr(node.chars)
            return str(self._add_rule(f"{base}-char", expr)) if expr.startswith("(") else expr
        if isinstance(node, Seq):
            parts: list[str] = []
            for part in (self._emit(item, base) for item in node.items):
                if parts and _LITERAL.fullmatch(parts[-1]) and _LITERAL.fullmatch(part):
                    parts[-1] = parts[-1][:-1] + part[1:]  # one literal: "ab", not "a" "b"
                elif part:
                    parts.append(part)
            return " ".join(parts)
        if isinstance(node, Alt):
            options = [self._emit(option, base) for option in node.options]
            filled = [option for option in options if option]
            if not filled:
                return ""
            if len(filled) < len(options):
                return self._optional_rule(f"{base}-part", " | ".join(filled))
            return "(" + " | ".join(filled) + ")"
        if isinstance(node, Rep):
            item = self._emit(node.item, base)
            if not item or node.hi == 0:
                return ""
            if not _ATOM.fullmatch(item):
                item = str(self._add_rule(f"{base}-part", item))
            return repeat(item, node.lo, node.hi)
        return ""

    def _add_primitive(self, name: str, rule: BuiltinRule) -> str:
        if name == "char" or rule is PRIMITIVE_RULES["char"]:
            rule = _SAFE_CHAR
        return str(super()._add_primitive(name, rule))
