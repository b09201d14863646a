"""Saved KV sequence states that outlive their slot: a host-memory tier and a disk tier.

A slot's KV sequence is lost when the slot is reused for an unrelated prompt. Before that
happens the engine saves the sequence's state (llama.cpp's opaque bytes for one sequence)
here, keyed by the tokens it holds; a later prompt that starts with those tokens restores
it instead of prefilling them again. This module only stores bytes and tokens (no
llama.cpp calls), so it is tested without a model.

Entries live in RAM, bounded by bytes, least recently used first out; with a directory, an
entry pushed out of RAM spills to a file there (bounded by bytes too), and `close` writes
what RAM still holds. An entry saved with `retain` (a request's `prompt_cache_retention`
"24h") is written to the disk tier at once, and either tier evicts it only when no entry
without `retain` is left to evict; the mark lives in memory (files are not marked).

Each file starts with a header naming the model identity it was made with: at start the
directory is scanned, files of another identity (another model, context size, KV type,
llama.cpp version) or damaged ones are deleted, and the rest form the index. The scan runs
on a thread of its own (see `KVTier.__init__`), so a directory of many files does not hold
the start up. Files are written to a temporary name and renamed, so a crash never leaves a
half file under a real name.

Thread-safe: the decode worker saves and restores, other threads read `stats`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
import threading
import time
import uuid
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from respd.engines.llamacpp.slots import common_prefix

log = logging.getLogger(__name__)

# A restore copies the whole saved state (every token of it) and then the prompt's tail is
# decoded anyway; for a gain of a few dozen tokens plain prefill costs about as much, and
# every tiny prefix saved would crowd out the long ones worth keeping.
MIN_RESTORE_TOKENS = 64
# A sequence that extends a saved entry replaces it when saved (one state copy, a few ms
# at most), and a later turn then skips prefilling the extension, which costs ~4 ms a token
# on two cores; so a sequence is saved once it holds this many tokens beyond what is kept.
# A conversation's turn (a short instruction and a short answer) adds about 45.
MIN_SAVE_TOKENS = 16

MAGIC = b"RESPDKV1"
SUFFIX = ".kv"
TMP_SUFFIX = ".tmp"
# magic, identity (sha256), n_tokens, len(cache_key utf-8), len(state)
HEADER = struct.Struct("<8s32sIIQ")
# Bytes of the model file hashed into its identity (start and end): cheap, and a file
# replaced under the same name almost surely differs there.
_SAMPLE = 1 << 20


def model_identity(model_path: Path, **settings: object) -> bytes:
    """A digest of what makes a saved state valid: the model file (name, size, a sample of
    its bytes) and the context `settings` given (KV types, slots, llama.cpp version...)."""
    h = hashlib.sha256()
    size = model_path.stat().st_size
    h.update(f"{model_path.name}\0{size}\0".encode())
    with model_path.open("rb") as f:
        h.update(f.read(_SAMPLE))
        f.seek(max(0, size - _SAMPLE))
        h.update(f.read(_SAMPLE))
    for key in sorted(settings):
        h.update(f"\0{key}={settings[key]!r}".encode())
    return h.digest()


def _entry_id(tokens: Sequence[int]) -> str:
    return hashlib.sha256(array("i", tokens).tobytes()).hexdigest()[:40]


@dataclass(frozen=True)
class TierMatch:
    """A saved state that serves a prompt: its first `reuse` tokens are the prompt's."""

    id: str
    tokens: tuple[int, ...]
    reuse: int
    cache_key: str | None


@dataclass(frozen=True)
class TierEntry:
    """What `entries` reports of one saved state."""

    id: str
    n_tokens: int
    state_bytes: int
    in_ram: bool
    on_disk: bool
    cache_key: str | None


@dataclass(frozen=True)
class TierStats:
    ram_entries: int = 0
    ram_bytes: int = 0
    disk_entries: int = 0
    disk_bytes: int = 0


@dataclass
class _Entry:
    id: str
    tokens: tuple[int, ...]
    size: int  # state bytes
    cache_key: str | None
    state: bytes | None = None  # the RAM copy
    retain: bool = False  # evicted after every entry without it
    file_bytes: int = 0  # the disk copy's size; 0: none


class KVTier:
    """Bounded LRU tiers of saved sequence states, looked up by longest token prefix."""

    def __init__(
        self,
        identity: bytes,
        *,
        ram_bytes: int,
        disk_dir: Path | None = None,
        disk_bytes: int = 0,
    ) -> None:
        if len(identity) != 32:
            raise ValueError("the identity must be a 32-byte digest")
        self.identity = identity
        self.ram_limit = max(0, ram_bytes)
        self.disk_dir = disk_dir if disk_dir is not None and disk_bytes > 0 else None
        self.disk_limit = max(0, disk_bytes) if self.disk_dir is not None else 0
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._ram: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self._disk: OrderedDict[str, None] = OrderedDict()
        self._ram_used = 0
        self._disk_used = 0
        self._last_stamp = 0
        # Temporary files of this process carry this mark; the scan deletes only others'.
        self._run = uuid.uuid4().hex[:12]
        self._indexed = threading.Event()
        self._stop = threading.Event()
        self._scanner: threading.Thread | None = None
        if self.disk_dir is None:
            self._indexed.set()
            return
        self.disk_dir.mkdir(parents=True, exist_ok=True)
        # The index is read in the background rather than waited for: reading the header
        # and tokens of thousands of files takes seconds, and waiting at the first lookup
        # would stall the decode worker, whose admissions make the lookups, and with it
        # every stream already running. Until the scan ends a lookup sees the files read so
        # far, newest first, so the conversations active just before the restart are found
        # soonest; a file not yet read is only a miss (its prompt is prefilled, the answer
        # is the same). Entries saved meanwhile are newer than every file found.
        self._scanner = threading.Thread(target=self._scan, name="respd-kv-scan", daemon=True)
        self._scanner.start()

    @property
    def persistent(self) -> bool:
        return self.disk_dir is not None

    def wait_indexed(self, timeout: float | None = None) -> bool:
        """Wait until the files found at start are indexed (or `timeout` passes)."""
        return self._indexed.wait(timeout)

    # -- lookups ------------------------------------------------------------------------

    def find(
        self,
        prompt: Sequence[int],
        limit: int,
        *,
        have: int = 0,
        cache_key: str | None = None,
    ) -> TierMatch | None:
        """The entry sharing the longest prefix with `prompt` (counted up to `limit`), when
        it beats the `have` tokens already cached elsewhere by `MIN_RESTORE_TOKENS`. Among
        equals: the one `cache_key` last saved, then one in RAM, then the smallest."""
        if limit < MIN_RESTORE_TOKENS:
            return None
        head = tuple(prompt[:MIN_RESTORE_TOKENS])
        best: tuple[tuple[int, bool, bool, int], _Entry] | None = None
        with self._lock:
            for e in self._entries.values():
                if e.tokens[:MIN_RESTORE_TOKENS] != head:
                    continue
                reuse = min(common_prefix(e.tokens, prompt), limit)
                keyed = cache_key is not None and e.cache_key == cache_key
                rank = (reuse, keyed, e.state is not None, -e.size)
                if best is None or rank > best[0]:
                    best = (rank, e)
        if best is None or best[0][0] - have < MIN_RESTORE_TOKENS:
            return None
        e = best[1]
        return TierMatch(e.id, e.tokens, best[0][0], e.cache_key)

    def covers(self, tokens: Sequence[int]) -> int:
        """The longest prefix of `tokens` some entry holds."""
        head = tuple(tokens[:MIN_RESTORE_TOKENS])
        with self._lock:
            return max(
                (
                    common_prefix(e.tokens, tokens)
                    for e in self._entries.values()
                    if e.tokens[:MIN_RESTORE_TOKENS] == head
                ),
                default=0,
            )

    def load(self, match: TierMatch) -> bytes | None:
        """The saved state of `match` (read from disk into RAM when only there), or None
        when it is gone or its file no longer holds what the index says."""
        with self._lock:
            e = self._entries.get(match.id)
            if e is None:
                return None
            if e.state is not None:
                self._touch(e)
                return e.state
            path = self._path(e.id)
        # Read outside the lock: stats readers need not wait for the disk.
        read = self._read(path)
        with self._lock:
            if self._entries.get(match.id) is not e:
                return None  # dropped or replaced meanwhile
            if read is None or read[0] != e.tokens or len(read[2]) != e.size:
                log.warning("dropping the saved KV state %s: its file is unreadable", e.id)
                self._drop(e)
                return None
            state = read[2]
            self._touch(e)
            if e.state is None and e.size <= self.ram_limit:  # not promoted meanwhile
                e.state = state
                self._ram[e.id] = None
                self._ram_used += e.size
                self._trim_ram()
            return state

    # -- saving -------------------------------------------------------------------------

    def put(
        self,
        tokens: Sequence[int],
        state: bytes,
        cache_key: str | None = None,
        *,
        retain: bool = False,
    ) -> bool:
        """Keep `state`, the KV of `tokens` (with `retain`: on disk at once, evicted last).
        False when not kept: too short, already held (an entry holds these tokens or more),
        or larger than every tier."""
        if len(tokens) < MIN_RESTORE_TOKENS or not state:
            return False
        if len(state) > max(self.ram_limit, self.disk_limit):
            return False
        key = tuple(tokens)
        with self._lock:
            related = [
                e
                for e in self._entries.values()
                if e.tokens[:MIN_RESTORE_TOKENS] == key[:MIN_RESTORE_TOKENS]
            ]
            for other in related:
                if common_prefix(other.tokens, key) == len(key):  # held, maybe with more
                    other.retain = other.retain or retain
                    self._touch(other)
                    return False
            for other in related:
                if common_prefix(other.tokens, key) == len(other.tokens):
                    self._drop(other)  # the new entry serves every prompt it served
            e = _Entry(_entry_id(key), key, len(state), cache_key, retain=retain)
            self._entries[e.id] = e
            if retain:
                self._spill(e, state)
            if e.size <= self.ram_limit:
                e.state = state
                self._ram[e.id] = None
                self._ram_used += e.size
                self._trim_ram()
            else:
                if not e.file_bytes:
                    self._spill(e, state)
                if not e.file_bytes:
                    del self._entries[e.id]
                    return False
            return e.id in self._entries

    def discard(self, entry_id: str) -> None:
        """Forget an entry (llama.cpp refused its state)."""
        with self._lock:
            e = self._entries.get(entry_id)
            if e is not None:
                self._drop(e)

    def close(self) -> None:
        """Stop the scan, then write what RAM holds to disk (oldest first, so the newest
        survive the bound)."""
        self._stop.set()
        if self._scanner is not None:
            self._scanner.join()
        with self._lock:
            if self.disk_dir is None:
                return
            for entry_id in list(self._ram):
                e = self._entries[entry_id]
                if not e.file_bytes and e.state is not None:
                    self._spill(e, e.state)

    # -- reporting ----------------------------------------------------------------------

    def stats(self) -> TierStats:
        with self._lock:
            return TierStats(len(self._ram), self._ram_used, len(self._disk), self._disk_used)

    def entries(self) -> list[TierEntry]:
        with self._lock:
            return [
                TierEntry(
                    e.id,
                    len(e.tokens),
                    e.size,
                    e.state is not None,
                    e.file_bytes > 0,
                    e.cache_key,
                )
                for e in self._entries.values()
            ]

    # -- internals (called with the lock held) ------------------------------------------

    def _touch(self, e: _Entry) -> None:
        if e.state is not None:
            self._ram.move_to_end(e.id)
        if e.file_bytes:
            self._disk.move_to_end(e.id)
            with contextlib.suppress(OSError):
                os.utime(self._path(e.id), ns=self._stamp())

    def _trim_ram(self) -> None:
        """Push the least recently used entries out of RAM until it fits, onto disk."""
        while self._ram_used > self.ram_limit and self._ram:
            entry_id = self._victim(self._ram)
            del self._ram[entry_id]
            e = self._entries[entry_id]
            state = e.state
            e.state = None
            self._ram_used -= e.size
            if not e.file_bytes and state is not None and self.disk_dir is not None:
                self._spill(e, state)
            if not e.file_bytes:
                del self._entries[entry_id]

    def _spill(self, e: _Entry, state: bytes) -> None:
        """Write `e` to disk (when it fits the disk tier), evicting older files first."""
        if self.disk_dir is None:
            return
        key = (e.cache_key or "").encode()
        size = HEADER.size + 4 * len(e.tokens) + len(key) + len(state)
        if size > self.disk_limit:
            return
        while self._disk_used + size > self.disk_limit and self._disk:
            victim = self._entries[self._victim(self._disk)]
            if victim.retain and not e.retain:
                return  # the disk holds only retained entries: they stay
            self._unlink(victim)
        path = self._path(e.id)
        tmp = path.with_name(f".{self._run}.{e.id}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}")
        try:
            with tmp.open("wb") as f:
                f.write(HEADER.pack(MAGIC, self.identity, len(e.tokens), len(key), len(state)))
                f.write(array("i", e.tokens).tobytes())
                f.write(key)
                f.write(state)
            os.utime(tmp, ns=self._stamp())
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("could not write a saved KV state to %s: %s", path, exc)
            tmp.unlink(missing_ok=True)
            return
        e.file_bytes = size
        self._disk[e.id] = None
        self._disk_used += size

    def _victim(self, order: OrderedDict[str, None]) -> str:
        """The entry a tier evicts next: its least recently used one without `retain`,
        else its least recently used one."""
        for entry_id in order:
            if not self._entries[entry_id].retain:
                return entry_id
        return next(iter(order))

    def _stamp(self) -> tuple[int, int]:
        """Times for a file just used: its mtime orders the disk's LRU across a restart,
        so they strictly increase (the filesystem's own clock is too coarse)."""
        self._last_stamp = max(time.time_ns(), self._last_stamp + 1)
        return self._last_stamp, self._last_stamp

    def _unlink(self, e: _Entry) -> None:
        """Delete `e`'s file; the entry goes too unless RAM holds it."""
        if e.file_bytes:
            self._path(e.id).unlink(missing_ok=True)
            del self._disk[e.id]
            self._disk_used -= e.file_bytes
            e.file_bytes = 0
        if e.state is None:
            self._entries.pop(e.id, None)

    def _drop(self, e: _Entry) -> None:
        if e.state is not None:
            del self._ram[e.id]
            self._ram_used -= e.size
            e.state = None
        self._unlink(e)
        self._entries.pop(e.id, None)

    def _path(self, entry_id: str) -> Path:
        assert self.disk_dir is not None
        return self.disk_dir / f"{entry_id}{SUFFIX}"

    def _read(self, path: Path) -> tuple[tuple[int, ...], str | None, bytes] | None:
        """(tokens, cache_key, state) of a file of this identity, or None."""
        try:
            data = path.read_bytes()
        except OSError:
            return None
        parsed = self._parse_head(data[: HEADER.size], len(data))
        if parsed is None:
            return None
        n, klen, slen = parsed
        at = HEADER.size
        tokens = tuple(array("i", data[at : at + 4 * n]))
        at += 4 * n
        key = data[at : at + klen].decode("utf-8", "replace") or None
        return tokens, key, data[at + klen : at + klen + slen]

    def _parse_head(self, head: bytes, file_size: int) -> tuple[int, int, int] | None:
        if len(head) < HEADER.size:
            return None
        magic, identity, n, klen, slen = HEADER.unpack(head)
        if magic != MAGIC or identity != self.identity:
            return None
        if file_size != HEADER.size + 4 * n + klen + slen or n < MIN_RESTORE_TOKENS:
            return None
        return n, klen, slen

    def _index_file(self, path: Path) -> _Entry | None:
        """The entry of a file of this identity, reading its header and tokens only."""
        try:
            with path.open("rb") as f:
                st = os.fstat(f.fileno())
                parsed = self._parse_head(f.read(HEADER.size), st.st_size)
                if parsed is None:
                    return None
                n, klen, slen = parsed
                tokens = tuple(array("i", f.read(4 * n)))
                key = f.read(klen).decode("utf-8", "replace") or None
        except OSError:
            return None
        if path.stem != _entry_id(tokens):
            return None
        return _Entry(path.stem, tokens, slen, key, file_bytes=st.st_size)

    def _scan(self) -> None:
        """Index the files a previous run left (the scanning thread's body)."""
        try:
            self._scan_files()
        except Exception:  # an unreadable directory: the tier starts cold
            log.exception("indexing the KV cache directory %s failed", self.disk_dir)
        finally:
            self._indexed.set()

    def _scan_files(self) -> None:
        """Delete leftovers of interrupted writes and files of another identity; index the
        rest newest first, each visible to lookups once read, in least-recently-used order
        (by mtime) behind everything saved since the start. Files past the disk bound are
        the oldest and are deleted."""
        assert self.disk_dir is not None
        found: list[tuple[int, Path]] = []
        with os.scandir(self.disk_dir) as listing:
            for item in listing:
                if item.name.endswith(TMP_SUFFIX):
                    if not item.name.startswith(f".{self._run}."):
                        Path(item.path).unlink(missing_ok=True)
                elif item.name.endswith(SUFFIX) and item.is_file():
                    with contextlib.suppress(OSError):
                        found.append((item.stat().st_mtime_ns, Path(item.path)))
        found.sort(key=lambda f: f[0], reverse=True)
        for _, path in found:
            if self._stop.is_set():
                return
            indexed = self._index_file(path)
            if indexed is None:
                if path.exists():
                    log.info("removing the saved KV state %s: another model's or damaged", path)
                    path.unlink(missing_ok=True)
                continue
            with self._lock:
                self._adopt(indexed)

    def _adopt(self, found: _Entry) -> None:
        """Index a file found by the scan (with the lock held)."""
        e = self._entries.get(found.id)
        if e is not None and e.file_bytes:
            return  # saved again since the start: the file is that save's
        if self._disk_used + found.file_bytes > self.disk_limit:
            self._path(found.id).unlink(missing_ok=True)
            if e is None:
                return
        elif e is None:
            self._entries[found.id] = e = found
        else:
            e.file_bytes = found.file_bytes  # RAM holds it since the start: the file is its
        if e.file_bytes:
            self._disk[e.id] = None
            self._disk.move_to_end(e.id, last=False)  # older than every file indexed yet
            self._disk_used += e.file_bytes
