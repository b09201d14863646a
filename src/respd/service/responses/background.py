"""Background responses: run server-side as asyncio tasks, record their event log, cancel.

A job keeps its whole event log in memory while it runs (live followers read it from there)
and flushes it to the store in batches, so `GET /v1/responses/{id}?stream=true` can replay
the stream after the job ended, or after a restart. The response record is written when the
job is queued, when it starts, and when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field

from openai.types.responses import ResponseStreamEvent

from respd.protocol.wire import wire
from respd.service.generation.output import Usage
from respd.service.responses.events import ResponseEventMachine
from respd.service.responses.service import PreparedResponse, ResponsesService
from respd.store.base import JSON, TERMINAL_STATUSES, Store

log = logging.getLogger(__name__)

FLUSH_EVERY = 32  # events per store write while a job runs
RESTARTED = "The server restarted before this background response finished; it was not completed."
SHUT_DOWN = "The server shut down before this background response finished."


@dataclass
class Job:
    prepared: PreparedResponse
    machine: ResponseEventMachine
    events: list[JSON] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    task: asyncio.Task[None] | None = None
    cancel_requested: bool = False
    deleted: bool = False
    done: bool = False
    flushed: int = 0  # events[:flushed] are in the store

    def unflushed(self) -> list[JSON]:
        """The events not yet in the store, marked as written (the caller writes them)."""
        batch = self.events[self.flushed :]
        self.flushed = len(self.events)
        return batch

    @property
    def owner(self) -> str:
        return self.prepared.owner

    async def publish(self, events: list[JSON], *, done: bool = False) -> None:
        async with self.changed:
            self.events.extend(events)
            self.done = self.done or done
            self.changed.notify_all()

    def _ready(self, index: int) -> bool:
        return len(self.events) > index or self.done

    async def follow(self, after: int) -> AsyncGenerator[JSON, None]:
        """Every event with `sequence_number > after`, then live ones until the job ends."""
        index = 0
        while True:
            async with self.changed:
                await self.changed.wait_for(functools.partial(self._ready, index))
                batch = self.events[index:]
                finished = self.done
            index += len(batch)
            for event in batch:
                if event["sequence_number"] > after:
                    yield event
            if finished and index >= len(self.events):
                return


class BackgroundJobs:
    def __init__(self, service: ResponsesService, store: Store) -> None:
        self.service = service
        self.store = store
        self.jobs: dict[str, Job] = {}

    def live(self, owner: str, response_id: str) -> Job | None:
        job = self.jobs.get(response_id)
        return job if job is not None and job.owner == owner else None

    async def start(self, prepared: PreparedResponse) -> Job:
        """Store the response as `queued` and start it; returns before any generation."""
        machine = ResponseEventMachine(prepared.echo, status="queued")
        job = Job(prepared, machine)
        events = self.service.run(prepared, machine)  # a full engine is a 503 now
        try:
            await self.store.save_response(self.service.record(prepared, machine))
        except BaseException:
            await events.aclose()
            raise
        self.jobs[machine.id] = job
        job.task = asyncio.create_task(self._run(job, events), name=f"background {machine.id}")
        return job

    async def _run(self, job: Job, events: AsyncGenerator[ResponseStreamEvent, None]) -> None:
        try:
            await self._generate(job, events)
        except asyncio.CancelledError:
            await self._stop(job)
        except Exception:
            log.exception("background response %s failed", job.machine.id)
            if not _terminal(job.machine):
                await job.publish([wire(e) for e in job.machine.fail("The response failed.")])
        finally:
            await self._finish(job)

    async def _generate(self, job: Job, events: AsyncGenerator[ResponseStreamEvent, None]) -> None:
        machine, prepared = job.machine, job.prepared
        async with aclosing(events):
            async for event in events:
                await job.publish([wire(event)])
                if event.type == "response.in_progress":
                    await self.store.save_response(
                        self.service.record(prepared, machine), events=job.unflushed()
                    )
                elif len(job.events) - job.flushed >= FLUSH_EVERY and not _terminal(machine):
                    await self.store.append_events(machine.id, job.unflushed())

    async def _stop(self, job: Job) -> None:
        """The task was cancelled (closing the engine's iterator stopped the generation):
        `cancelled` with the partial output on request, `failed` on shutdown."""
        machine = job.machine
        if _terminal(machine):
            return
        if job.cancel_requested:
            usage = Usage(job.prepared.prompt_tokens, machine.generated_tokens)
            closing = machine.cancel(usage=usage)
        else:
            closing = machine.fail(SHUT_DOWN)
        await job.publish([wire(e) for e in closing])

    async def _finish(self, job: Job) -> None:
        """Store the final record with the rest of the event log, then release followers."""
        machine = job.machine
        try:
            if not job.deleted:
                final = self.service.persist(job.prepared, machine, events=job.unflushed())
                await asyncio.shield(final)
        except Exception:
            log.exception("background response %s: could not store its result", machine.id)
        finally:
            self.jobs.pop(machine.id, None)
            await job.publish([], done=True)

    async def cancel(self, job: Job) -> None:
        """Stop the generation now; returns once the cancelled response is stored."""
        job.cancel_requested = True
        await self._halt(job)

    async def _halt(self, job: Job) -> None:
        task = job.task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)
        if not job.done:  # cancelled before its first step: its own handlers never ran
            await self._stop(job)
            await self._finish(job)

    async def delete(self, job: Job) -> None:
        job.deleted = True
        await self.cancel(job)

    async def recover(self) -> int:
        """Mark responses a previous process left queued/in progress as failed."""
        count = 0
        for record in await self.store.unfinished_responses():
            if record.id in self.jobs:
                continue
            before = dict(record.response)
            response = {**before, "status": "failed"}
            response["error"] = {"code": "server_error", "message": RESTARTED}
            record.status = "failed"
            record.response = response
            recorded = await self.store.read_events(record.owner, record.id, -1)
            events: list[JSON] = []
            if not recorded:
                # Killed before its first events reached the store: a replay still has to
                # start with response.created, so the log is opened from the stored record.
                events.append(
                    {"type": "response.created", "sequence_number": 0, "response": before}
                )
            seq = recorded[-1]["sequence_number"] + 1 if recorded else len(events)
            events.append({"type": "response.failed", "sequence_number": seq, "response": response})
            await self.store.save_response(record, events=events)
            count += 1
        if count:
            log.warning("marked %d unfinished background response(s) as failed", count)
        return count

    async def shutdown(self) -> None:
        """Stop every job; each is stored as failed so no response stays in progress."""
        for job in list(self.jobs.values()):
            await self._halt(job)


def _terminal(machine: ResponseEventMachine) -> bool:
    return machine.status in TERMINAL_STATUSES
