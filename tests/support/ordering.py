"""A suite's own order inside a whole run. A conftest's collection hook is handed every item
pytest collected, not only those under its directory, so each suite reorders its own items in
the places they already hold and leaves the other suites' alone."""

from __future__ import annotations

from pathlib import Path

import pytest


def marked_first(items: list[pytest.Item], directory: Path, marker: str) -> None:
    """Among the items under `directory`, those marked `marker` first, the rest in their
    order; items elsewhere keep their places."""
    slots = [i for i, item in enumerate(items) if item.path.is_relative_to(directory)]
    mine = sorted((items[i] for i in slots), key=lambda it: it.get_closest_marker(marker) is None)
    for slot, item in zip(slots, mine, strict=True):
        items[slot] = item
