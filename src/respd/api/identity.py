"""Who is asking. Every stored object is owned by, and only visible to, this identity.

There is no authentication yet, so every request is the one anonymous identity; when API
keys arrive, this is the one place that maps a request to its owner.
"""

from __future__ import annotations

from fastapi import Request

ANONYMOUS = "anonymous"


def owner_of(request: Request) -> str:
    return ANONYMOUS
