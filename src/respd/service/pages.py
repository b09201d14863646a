"""OpenAI list pages (`object: "list"`, `first_id`, `last_id`, `has_more`) over stored items."""

from __future__ import annotations

from respd.protocol.errors import InvalidRequest
from respd.store.base import JSON

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


def check_page_params(
    limit: int | None,
    order: str | None,
    *,
    default_limit: int = DEFAULT_LIMIT,
    max_limit: int = MAX_LIMIT,
) -> tuple[int, str]:
    limit = default_limit if limit is None else limit
    if not 1 <= limit <= max_limit:
        raise InvalidRequest(
            f"Invalid 'limit': expected a value between 1 and {max_limit}, got {limit}.",
            param="limit",
            code="invalid_value",
        )
    order = order or "desc"
    if order not in ("asc", "desc"):
        raise InvalidRequest(
            f"Invalid 'order': expected 'asc' or 'desc', got {order!r}.",
            param="order",
            code="invalid_value",
        )
    return limit, order


def page(
    items: list[JSON],
    *,
    after: str | None,
    limit: int | None,
    order: str | None,
    default_limit: int = DEFAULT_LIMIT,
    max_limit: int = MAX_LIMIT,
) -> JSON:
    """An OpenAI list object over `items` (stored oldest first), cursor = item id."""
    limit, order = check_page_params(limit, order, default_limit=default_limit, max_limit=max_limit)
    ordered = list(reversed(items)) if order == "desc" else list(items)
    if after is not None:
        ids = [i.get("id") for i in ordered]
        if after not in ids:
            raise InvalidRequest(
                f"Invalid 'after': no item with id '{after}' in this list.",
                param="after",
                code="invalid_value",
            )
        ordered = ordered[ids.index(after) + 1 :]
    data = ordered[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) > limit,
    }
