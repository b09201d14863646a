"""Adding a router's routes to an app."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI


def add_routes(app: FastAPI, router: APIRouter) -> None:
    """Put `router`'s routes in `app`'s table as they were built at import.

    The project's routers carry no prefix, dependency or tag of their own. `include_router`
    would wrap the router and rebuild every route's dependencies for each new app on its first
    request (~40 ms per app: the unit suite builds an app per test)."""
    app.router.routes.extend(router.routes)
