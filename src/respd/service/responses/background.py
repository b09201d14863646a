"""Background responses: run server-side as asyncio tasks, record their event log, cancel.

A job keeps its whole event log in memory while it runs (live followers in this process read
it from there) and flushes it to the store, with the response's snapshot, every few events
or fractions of a second, so `GET /v1/responses/{id}?stream=true` can replay the stream
after the job ended, after a restart, or follow it live from another replica.

Several replicas may share one store (PostgreSQL). The replica that runs a job holds a lease
on it (`--job-lease-secs`) and renews it; every replica sweeps for jobs whose lease ran out
(their replica died) and records them failed; a cancel or delete through another replica
reaches the holder through the store (a cancel flag it polls, a row that is gone), and a
follower on another replica polls the stored event log.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from openai.types.responses import ResponseStreamEvent

from respd.protocol.wire import wire
from respd.service.generation.output import Usage
from respd.service.responses.events import ResponseEventMachine
from respd.service.responses.runner import PreparedResponse, ResponseRunner
from respd.store.base import (
    DEFAULT_JOB_LEASE_SECS,
    JSON,
    TERMINAL_STATUSES,
    ResponseRecord,
    Store,
)

log = logging.getLogger(__name__)

FLUSH_EVERY = 32  # events per store write while a job runs...
FLUSH_SECS = 0.2  # ...or fewer, once this old: what followers on other replicas wait at most
CANCEL_POLL_SECS = 0.25  # how often a replica running jobs looks for cancel requests
FOLLOW_POLL_SECS = 0.1  # how often a follower of another replica's job reads the log
RESTARTED = (
    "The server running this background response stopped (it crashed or restarted) before "
    "the response finished; it was not completed."
)
SHUT_DOWN = "The server shut down before this background response finished."


class JobLost(Exception):
    """The store no longer lets this replica write the job (deleted, or taken over)."""


@dataclass
class Job:
    prepared: PreparedResponse
    machine: ResponseEventMachine
    events: list[JSON] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    task: asyncio.Task[None] | None = None
    cancel_requested: bool = False
    deleted: bool = False  # deleted (or lost): nothing more is written for it
    done: bool = False
    flushed: int = 0  # events[:flushed] are in the store
    flushed_at: float = field(default_factory=time.monotonic)
    # Gives back the owner's slot and background place once the job has ended.
    release: Callable[[], None] | None = None

    def unflushed(self) -> list[JSON]:
        """The events not yet in the store, marked as written (the caller writes them)."""
        batch = self.events[self.flushed :]
        self.flushed = len(self.events)
        self.flushed_at = time.monotonic()
        return batch

    def flush_due(self) -> bool:
        pending = len(self.events) - self.flushed
        return pending >= FLUSH_EVERY or (
            pending > 0 and time.monotonic() - self.flushed_at >= FLUSH_SECS
        )

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
    def __init__(
        self,
        service: ResponseRunner,
        store: Store,
        *,
        lease_secs: float = DEFAULT_JOB_LEASE_SECS,
    ) -> None:
        self.service = service
        self.store = store
        self.lease_secs = lease_secs
        self.jobs: dict[str, Job] = {}
        # Unique per process, so a restarted replica never mistakes its predecessor's
        # leases for its own.
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._maintenance: asyncio.Task[None] | None = None

    def live(self, owner: str, response_id: str) -> Job | None:
        job = self.jobs.get(response_id)
        return job if job is not None and job.owner == owner else None

    async def open(self) -> None:
        """Fail what dead processes left unfinished, then keep leases, cancel requests
        and other replicas' abandoned jobs in hand until `shutdown`."""
        await self.recover()
        self._maintenance = asyncio.create_task(self._maintain(), name="background jobs")

    async def start(
        self, prepared: PreparedResponse, release: Callable[[], None] | None = None
    ) -> Job:
        """Store the response as `queued` and start it; returns before any generation.
        `release` is called once the job has ended."""
        machine = prepared.machine(status="queued")
        job = Job(prepared, machine, release=release)
        events = self.service.run(prepared, machine)  # a full engine is a 503 now
        try:
            record = self.service.record(prepared, machine)
            await self.store.start_job(record, self.worker, self.lease_secs)
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
        except JobLost:
            job.deleted = True
            log.info("background response %s was deleted or taken over", job.machine.id)
        except Exception:
            log.exception("background response %s failed", job.machine.id)
            if not _terminal(job.machine):
                await job.publish([wire(e) for e in job.machine.fail("The response failed.")])
        finally:
            await self._finish(job)

    async def _flush(self, job: Job) -> None:
        """Write the snapshot and the pending events; the generation stops (closing the
        engine's iterator) when the job is no longer ours to write."""
        record = self.service.record(job.prepared, job.machine)
        if not await self.store.save_response(record, events=job.unflushed(), worker=self.worker):
            raise JobLost(job.machine.id)

    async def _generate(self, job: Job, events: AsyncGenerator[ResponseStreamEvent, None]) -> None:
        machine = job.machine
        async with aclosing(events):
            async for event in events:
                await job.publish([wire(event)])
                if _terminal(machine):
                    continue  # the final write in _finish carries the rest
                if event.type == "response.in_progress" or job.flush_due():
                    await self._flush(job)

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
        """Store the final record with the rest of the event log, and the turn in its
        conversation, in one write; then release followers."""
        machine, prepared = job.machine, job.prepared
        try:
            if not job.deleted:
                conv_id = prepared.history.conversation_id
                turn = (conv_id, prepared.input_items + machine.output) if conv_id else None
                final = self.store.save_response(
                    self.service.record(prepared, machine),
                    conversation=turn,
                    events=job.unflushed(),
                    worker=self.worker,
                )
                if not await asyncio.shield(final):
                    log.info("background response %s was deleted or taken over", machine.id)
        except Exception:
            log.exception("background response %s: could not store its result", machine.id)
        finally:
            self.jobs.pop(machine.id, None)
            if job.release is not None:
                job.release()
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

    # -- jobs of other replicas ---------------------------------------------------------------

    async def cancel_elsewhere(self, owner: str, response_id: str) -> None:
        """Cancel a job this replica does not run: flag it for its holder and wait until
        the holder has stored it finished. If the holder is dead (its lease ran out) this
        replica takes the job over and records it cancelled with what was stored."""
        if not await self.store.request_cancel(owner, response_id):
            return  # finished (or gone) already
        deadline = time.monotonic() + self.lease_secs + 1
        while time.monotonic() < deadline:
            record = await self.store.get_response(owner, response_id)
            if record is None or record.status in TERMINAL_STATUSES:
                return
            taken = await self.store.claim_job(response_id, self.worker, self.lease_secs)
            if taken is not None:
                taken.status = "cancelled"
                taken.response = {**taken.response, "status": "cancelled"}
                await self.store.save_response(taken, worker=self.worker)
                return
            await asyncio.sleep(CANCEL_POLL_SECS / 2)
        log.warning("background response %s: cancel not confirmed in time", response_id)

    async def follow_stored(
        self, owner: str, response_id: str, after: int
    ) -> AsyncGenerator[JSON, None]:
        """Events with `sequence_number > after` from the store, following a job that
        another replica runs until its record is finished (or gone)."""
        while True:
            # The record first: its last write carries the last events, so once it reads
            # finished, one more read of the log has everything.
            record = await self.store.get_response(owner, response_id)
            finished = record is None or record.status in TERMINAL_STATUSES
            for event in await self.store.read_events(owner, response_id, after):
                after = event["sequence_number"]
                yield event
            if finished:
                return
            await asyncio.sleep(FOLLOW_POLL_SECS)

    async def _maintain(self) -> None:
        """Poll for cancel requests while jobs run, renew their leases, and sweep for jobs
        whose replica died; a failing store is logged and retried, never fatal."""
        poll = min(CANCEL_POLL_SECS, self.lease_secs / 4)
        renewed = swept = time.monotonic()
        while True:
            await asyncio.sleep(poll)
            try:
                now = time.monotonic()
                if self.jobs:
                    for rid in await self.store.cancel_requests(self.worker):
                        job = self.jobs.get(rid)
                        if job is not None and not _terminal(job.machine):
                            await self.cancel(job)
                if now - renewed >= self.lease_secs / 3:
                    renewed = now
                    await self._renew()
                if now - swept >= self.lease_secs / 2:
                    swept = now
                    await self.recover()
            except Exception:
                log.exception("background job maintenance failed; retrying")

    async def _renew(self) -> None:
        running = [rid for rid, job in self.jobs.items() if not _terminal(job.machine)]
        for rid in await self.store.renew_leases(self.worker, running, self.lease_secs):
            job = self.jobs.get(rid)
            if job is not None and not _terminal(job.machine):
                log.info("background response %s was deleted or taken over", rid)
                job.deleted = True
                await self._halt(job)

    async def recover(self) -> int:
        """Record as failed the unfinished jobs whose process is gone (at start-up: any
        earlier process's; later: another replica's whose lease ran out)."""
        count = 0
        while claimed := await self.store.claim_stale_jobs(self.worker, self.lease_secs):
            for record in claimed:
                if record.id not in self.jobs:
                    await self._fail_abandoned(record)
                    count += 1
            if all(record.id in self.jobs for record in claimed):
                break
        if count:
            log.warning("marked %d abandoned background response(s) as failed", count)
        return count

    async def _fail_abandoned(self, record: ResponseRecord) -> None:
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
            events.append({"type": "response.created", "sequence_number": 0, "response": before})
        seq = recorded[-1]["sequence_number"] + 1 if recorded else len(events)
        events.append({"type": "response.failed", "sequence_number": seq, "response": response})
        await self.store.save_response(record, events=events, worker=self.worker)

    async def shutdown(self) -> None:
        """Stop every job; each is stored as failed so no response stays in progress."""
        if self._maintenance is not None:
            self._maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintenance
        for job in list(self.jobs.values()):
            await self._halt(job)


def _terminal(machine: ResponseEventMachine) -> bool:
    return machine.status in TERMINAL_STATUSES
