"""A request's `provider` object as the engines' `Route`, and routing's refusal as the
client's error."""

from __future__ import annotations

from respd.engines.route import MaxPrice, NoRoute, Route
from respd.protocol.errors import APIError
from respd.protocol.routing import ProviderPreferences

RETRY_AFTER_SECONDS = 1


def route_of(prefs: ProviderPreferences | None) -> Route | None:
    if prefs is None:
        return None
    limit = prefs.max_price
    return Route(
        order=tuple(prefs.order or ()),
        allow_fallbacks=prefs.allow_fallbacks,
        only=tuple(prefs.only) if prefs.only is not None else None,
        ignore=tuple(prefs.ignore or ()),
        sort=prefs.sort,
        require_parameters=prefs.require_parameters,
        max_price=MaxPrice(limit.prompt, limit.completion) if limit is not None else None,
    )


def no_route_error(exc: NoRoute) -> APIError:
    """400 naming the `provider` object when the request ruled every provider out; 503
    with a retry hint when those it allows are unavailable."""
    if exc.status == 503:
        return APIError(
            str(exc),
            status_code=503,
            error_type="server_error",
            code="provider_unavailable",
            headers={"retry-after": str(RETRY_AFTER_SECONDS)},
        )
    return APIError(
        str(exc),
        status_code=400,
        error_type="invalid_request_error",
        param="provider",
        code="no_provider_available",
    )
