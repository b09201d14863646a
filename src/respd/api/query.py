"""Query parameters shared by several routes."""

from __future__ import annotations

from fastapi import Request

from respd.protocol.errors import InvalidRequest
from respd.protocol.responses import INCLUDABLE


def include_param(request: Request) -> list[str]:
    """`include[]=a&include[]=b` (the SDK's spelling) or `include=a`, each value checked."""
    values = request.query_params.getlist("include[]") + request.query_params.getlist("include")
    for value in values:
        if value not in INCLUDABLE:
            raise InvalidRequest(
                f"Invalid value for 'include': {value!r}. Supported values are: "
                f"{', '.join(sorted(INCLUDABLE))}.",
                param="include",
                code="invalid_value",
            )
    return values
