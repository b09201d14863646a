"""The periodic purge of expired records: a task beside the server, off the request path.

Expired records are already invisible to every read; this only gives their space back.
Each store does its own work off the event loop (sqlite in a worker thread, in short
batches; postgresql over its async driver)."""

from __future__ import annotations

import asyncio
import logging

from respd.store.base import Store

log = logging.getLogger(__name__)


async def purge_periodically(store: Store, every_secs: float) -> None:
    """Purge every `every_secs` seconds (0: never) until cancelled; a failure is logged
    and the next round tries again."""
    if every_secs <= 0:
        return
    while True:
        await asyncio.sleep(every_secs)
        try:
            removed = await store.purge_expired()
        except Exception:
            log.exception("purging expired records failed; retrying later")
            continue
        if removed:
            log.info("purged %d expired record(s)", removed)
