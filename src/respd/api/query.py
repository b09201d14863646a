"""Query parameters shared by several routes."""

from __future__ import annotations

from fastapi import Request

from respd.protocol.responses import check_include


def include_param(request: Request) -> list[str]:
    """`include[]=a&include[]=b` (the SDK's spelling) or `include=a`, each value checked."""
    values = request.query_params.getlist("include[]") + request.query_params.getlist("include")
    check_include(values)
    return values
