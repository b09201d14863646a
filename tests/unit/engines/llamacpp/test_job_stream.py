"""A job's event stream: closing it or dropping it unread releases the job to the engine
(which cancels it and wakes its worker)."""

from __future__ import annotations

import asyncio
import gc

from respd.engines.base import SamplingParams
from respd.engines.llamacpp.jobs import Job, JobStream
from respd.engines.llamacpp.outbox import Outbox


def make_job() -> Job:
    loop = asyncio.new_event_loop()
    try:
        return Job([1, 2, 3], SamplingParams(), None, None, loop, asyncio.Queue(), Outbox())
    finally:
        loop.close()


def test_a_stream_dropped_unread_releases_its_job() -> None:
    released: list[Job] = []
    job = make_job()
    stream = JobStream(job, released.append)
    del stream
    gc.collect()
    assert released == [job]


def test_closing_a_stream_releases_its_job() -> None:
    released: list[Job] = []
    job = make_job()
    stream = JobStream(job, released.append)
    asyncio.run(stream.aclose())
    assert released[0] is job
