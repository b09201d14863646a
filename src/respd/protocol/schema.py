"""A client's JSON Schema checked as a JSON Schema document before anything compiles it.

Tool `parameters`, `text.format.schema` and Chat's `response_format` schema are read by
the grammar compilers and the template renderer, which trust the schema's shape
(`properties` an object, `items` a schema). A document the JSON Schema metaschema refuses
(`"properties": "abc"`) is a 400 here, naming where in the schema it went wrong.
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft7Validator, Draft202012Validator, ValidationError
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

from respd.protocol.errors import InvalidRequest


def check_schema_document(schema: Any, param: str, code: str = "invalid_value") -> None:
    """`schema` valid against its metaschema: the draft its `$schema` names, else
    draft 2020-12 or draft-07 (whose tuple `items` many generators still write)."""
    if not isinstance(schema, dict):
        raise InvalidRequest(
            f"Invalid schema in '{param}': a JSON Schema must be an object.",
            param=param,
            code=code,
        )
    declared = schema.get("$schema")
    named = validator_for(schema, default=None) if isinstance(declared, str) else None
    drafts = [named] if named is not None else [Draft202012Validator, Draft7Validator]
    first: ValidationError | None = None
    for draft in drafts:
        error = best_match(_meta(draft).iter_errors(schema))
        if error is None:
            return
        first = first or error
    assert first is not None
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first.absolute_path)
    raise InvalidRequest(
        f"Invalid schema in '{param}': at '{where.lstrip('.') or '(root)'}': "
        f"{_short(first.message)}.",
        param=param,
        code=code,
    )


def _meta(draft: type[Validator]) -> Validator:
    """A validator of `draft`'s metaschema, with no format checks: a `pattern` is a
    regular expression in ECMA 262's syntax, not Python's, and the engines read it so."""
    return validator_for(draft.META_SCHEMA, default=draft)(draft.META_SCHEMA)


def _short(message: str, limit: int = 200) -> str:
    return message if len(message) <= limit else message[:limit] + "..."
