"""Stored responses by id: retrieve, delete, cancel, list input items, replay the stream.

A background job may run in this process or in another replica sharing the store: a job
running here answers from memory; one running elsewhere is reached through the store (see
`BackgroundJobs.cancel_elsewhere` and `follow_stored`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing

from respd.protocol.errors import InvalidRequest, NotFound
from respd.protocol.wire import wire
from respd.service.pages import page
from respd.service.responses.background import BackgroundJobs
from respd.store.base import JSON, TERMINAL_STATUSES, ResponseRecord, Store


def response_not_found(response_id: str) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", param="response_id")


class StoredResponses:
    def __init__(self, store: Store, jobs: BackgroundJobs) -> None:
        self.store = store
        self.jobs = jobs

    async def _record(self, owner: str, response_id: str) -> ResponseRecord:
        record = await self.store.get_response(owner, response_id)
        if record is None:
            raise response_not_found(response_id)
        return record

    async def retrieve(self, owner: str, response_id: str) -> JSON:
        """The stored object; a running background job answers with its live snapshot."""
        job = self.jobs.live(owner, response_id)
        if job is not None:
            return wire(job.machine.snapshot())
        return (await self._record(owner, response_id)).response

    async def delete(self, owner: str, response_id: str) -> JSON:
        job = self.jobs.live(owner, response_id)
        if job is not None:
            await self.jobs.delete(job)
        # A job running on another replica stops there once it finds its row gone.
        if not await self.store.delete_response(owner, response_id):
            raise response_not_found(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    async def cancel(self, owner: str, response_id: str) -> JSON:
        """Stop a background response (partial output kept); a finished one is unchanged."""
        record = await self._record(owner, response_id)
        if not record.background:
            raise InvalidRequest("Only background responses can be cancelled.", param="response_id")
        job = self.jobs.live(owner, response_id)
        if job is not None:
            await self.jobs.cancel(job)
        elif record.status not in TERMINAL_STATUSES:
            await self.jobs.cancel_elsewhere(owner, response_id)
        return await self.retrieve(owner, response_id)

    async def input_items(
        self, owner: str, response_id: str, *, after: str | None, limit: int | None, order: str
    ) -> JSON:
        record = await self._record(owner, response_id)
        return page(record.input_items, after=after, limit=limit, order=order)

    async def open_stream(
        self, owner: str, response_id: str, starting_after: int | None
    ) -> AsyncGenerator[JSON, None]:
        """Check the id now (so a bad one is a plain 404), then replay its events."""
        record = await self._record(owner, response_id)
        if not record.background:
            raise InvalidRequest(
                "Only background responses can be streamed again; this response was not "
                "created with background=true.",
                param="stream",
            )
        return self._replay(owner, record, -1 if starting_after is None else starting_after)

    async def _replay(
        self, owner: str, record: ResponseRecord, after: int
    ) -> AsyncGenerator[JSON, None]:
        # A job leaves the registry only after its last event is stored: one of the two
        # sources below always holds the whole stream (the store's, for a finished job or
        # one that another replica runs, followed until it ends).
        job = self.jobs.live(owner, record.id)
        source = (
            job.follow(after)
            if job is not None
            else self.jobs.follow_stored(owner, record.id, after)
        )
        async with aclosing(source) as events:
            async for event in events:
                yield event
