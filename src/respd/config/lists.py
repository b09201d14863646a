"""How a list-valued flag is read: repeated flags, and several values in one string."""

from __future__ import annotations


def comma_separated(value: object) -> object:
    """`a,b` (an env var, or one flag) is the list [a, b]."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list):
        return [p.strip() for v in value for p in str(v).split(",") if p.strip()]
    return value
