"""Handing back zeroed pages: which mappings are candidates, and a real anonymous mapping
keeps its contents while its all-zero chunks stop being resident."""

from __future__ import annotations

import ctypes
import mmap
import sys
from pathlib import Path

import pytest

from respd.engines.llamacpp import pages

MAPS = """\
55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0004000000 rw-p 00000000 00:00 0
7f0004000000-7f0004100000 r--p 00000000 08:01 1234                       /models/m.gguf
7f0004100000-7f0004200000 rw-s 00000000 00:01 99                         /dev/zero (deleted)
7f0004200000-7f0004300000 ---p 00000000 00:00 0
7f0004300000-7f0004400000 rw-p 00010000 08:01 1234                       /lib/x.so
7fff00000000-7fff00021000 rw-p 00000000 00:00 0                          [stack]
"""


def test_only_private_anonymous_writable_mappings_are_candidates() -> None:
    assert pages.private_anonymous_mappings(MAPS) == {(0x7F0000000000, 0x7F0004000000)}


def test_new_ranges_leave_out_what_existed_before() -> None:
    before = {(100, 200), (500, 600)}
    after = {(100, 300), (500, 600), (700, 800), (400, 600)}
    # (100, 300) merged an old mapping with a new one: only its new part counts.
    assert pages.new_ranges(before, after) == [(200, 300), (400, 500), (700, 800)]


def resident_kib(start: int, end: int) -> int:
    """Resident KiB of the mapping holding [start, end), from /proc/self/smaps."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= start and end <= hi
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise via /proc: Linux")
def test_zero_chunks_are_released_and_contents_kept() -> None:
    libc = pages._libc()
    assert libc is not None
    size = 16 * pages.CHUNK
    area = mmap.mmap(-1, size)
    start = ctypes.addressof(ctypes.c_char.from_buffer(area))
    try:
        area.write(b"\0" * size)  # resident, as after llama.cpp's clear
        area[5 * pages.CHUNK + 10] = 7  # one chunk holds data
        before = resident_kib(start, start + size)
        assert before >= size // 1024
        released = pages.release_zeroed(start, start + size, libc)
        assert released == 15 * pages.CHUNK
        after = resident_kib(start, start + size)
        assert after <= pages.CHUNK // 1024 + 64  # the chunk with data (and a little slack)
        assert area[5 * pages.CHUNK + 10] == 7
        assert area[: 5 * pages.CHUNK].count(b"\0") == 5 * pages.CHUNK
        assert area[6 * pages.CHUNK :].count(b"\0") == 10 * pages.CHUNK
        area[0] = 1  # still writable
        assert area[0] == 1
    finally:
        area.close()
