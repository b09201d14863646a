"""Handing back the pages of a KV buffer that llama.cpp zeroed but nothing uses yet.

llama.cpp clears its whole KV buffer when it creates a context, which makes every page of
it resident at once (hundreds of MiB for a few slots of a long context) although a page
holds data only once a sequence reaches it. `MADV_DONTNEED` on a private anonymous page
drops it; the next read finds a zero page again and the next write a fresh one, so the
buffer's contents are unchanged. Resident memory then follows the cells in use.

Linux only (it reads `/proc/self/maps`); elsewhere nothing is released.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MADV_DONTNEED = 4
# Only a new mapping at least this large is looked at: smaller ones are interpreter arenas
# and thread stacks, which other threads may write to while they are tested.
MIN_MAPPING_BYTES = 16 * 2**20
CHUNK = 2**20  # zero test and release granularity (a multiple of the page size)

Mapping = tuple[int, int]  # [start, end) addresses


def private_anonymous_mappings(maps: str) -> set[Mapping]:
    """The readable and writable private anonymous mappings in a `/proc/<pid>/maps` text."""
    found = set()
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5 or fields[1] != "rw-p" or fields[4] != "0":
            continue
        if len(fields) == 6 and fields[5].strip():
            continue  # a file, or [heap] / [stack], not a bare allocation
        start, end = (int(x, 16) for x in fields[0].split("-"))
        found.add((start, end))
    return found


def _read_maps() -> set[Mapping]:
    try:
        return private_anonymous_mappings(Path("/proc/self/maps").read_text())
    except OSError:
        return set()


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def release_zeroed(start: int, end: int, libc: ctypes.CDLL) -> int:
    """Drop every all-zero `CHUNK` of [start, end); returns the bytes released. (The
    kernel merges neighbouring allocations into one mapping: the KV buffer shares its
    mapping with the compute and output buffers, so the test is per chunk.)"""
    zeros = (ctypes.c_char * CHUNK)()
    released = 0
    for at in range(start, end, CHUNK):
        n = min(CHUNK, end - at)
        if libc.memcmp(ctypes.c_void_p(at), zeros, ctypes.c_size_t(n)) != 0:
            continue
        if libc.madvise(ctypes.c_void_p(at), ctypes.c_size_t(n), MADV_DONTNEED) == 0:
            released += n
    return released


@contextmanager
def released_zero_pages() -> Iterator[dict[str, int]]:
    """Around the creation of a llama.cpp context: afterwards, release the all-zero pages
    of every large private anonymous mapping it created. Yields a dict whose "bytes" is
    then what was handed back."""
    libc = _libc()
    before = _read_maps() if libc is not None else set()
    released = {"bytes": 0}
    yield released
    if libc is None:
        return
    for start, end in new_ranges(before, _read_maps()):
        if end - start >= MIN_MAPPING_BYTES:
            released["bytes"] += release_zeroed(start, end, libc)


def new_ranges(before: set[Mapping], after: set[Mapping]) -> list[Mapping]:
    """The address ranges of `after` that no mapping of `before` covered (the kernel may
    merge a new mapping with an old neighbour into one)."""
    found = []
    for start, end in sorted(after - before):
        for old_start, old_end in before:
            if old_start < end and start < old_end:  # overlaps: keep the part past it
                if old_start <= start:
                    start = max(start, old_end)
                else:
                    end = min(end, old_start)
        if start < end:
            found.append((start, end))
    return found
