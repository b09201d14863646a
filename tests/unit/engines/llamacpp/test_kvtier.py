"""The tiers of saved KV states (pure bookkeeping and files, no model)."""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from respd.engines.llamacpp.kvtier import MIN_RESTORE_TOKENS, KVTier, model_identity

ID_A = hashlib.sha256(b"model a").digest()
ID_B = hashlib.sha256(b"model b").digest()


def toks(seed: int, n: int) -> list[int]:
    """`n` tokens; sequences of different seeds differ from their first token."""
    return [seed * 100_000 + i for i in range(n)]


def state(n: int, fill: int = 7) -> bytes:
    return bytes([fill % 256]) * n


def files(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


def test_ram_evicts_least_recently_used_by_bytes() -> None:
    tier = KVTier(ID_A, ram_bytes=250)
    a, b, c = toks(1, 100), toks(2, 100), toks(3, 100)
    assert tier.put(a, state(100)) and tier.put(b, state(100))
    hit = tier.find([*a, 5], limit=100)
    assert hit is not None and tier.load(hit) == state(100)  # `a` is now the most recent
    assert tier.put(c, state(100))
    assert tier.find([*b, 5], limit=100) is None  # `b` went
    assert tier.find([*a, 5], limit=100) is not None and len(tier.entries()) == 2
    assert tier.stats().ram_bytes == 200 and tier.stats().ram_entries == 2
    # A state bigger than every tier is not kept.
    assert not tier.put(toks(4, 100), state(251))
    assert tier.stats().ram_bytes == 200


def test_spills_to_disk_and_reloads(tmp_path: Path) -> None:
    tier = KVTier(ID_A, ram_bytes=150, disk_dir=tmp_path, disk_bytes=10_000)
    a, b = toks(1, 80), toks(2, 80)
    tier.put(a, state(100, 1), cache_key="ka")
    tier.put(b, state(100, 2))  # pushes `a` out of RAM onto disk
    stats = tier.stats()
    assert (stats.ram_entries, stats.disk_entries) == (1, 1)
    assert len(files(tmp_path)) == 1
    hit = tier.find([*a, 9, 9], limit=81)
    assert hit is not None and hit.reuse == 80 and hit.cache_key == "ka"
    assert tier.load(hit) == state(100, 1)
    # Loading put `a` back in RAM (its file stays) and pushed `b` to disk.
    by_len = {e.id: e for e in tier.entries()}
    assert by_len[hit.id].in_ram and by_len[hit.id].on_disk
    after = tier.stats()
    assert (after.ram_entries, after.ram_bytes, after.disk_entries) == (1, 100, 2)
    assert after.disk_bytes == sum(p.stat().st_size for p in tmp_path.iterdir())
    assert len(files(tmp_path)) == 2


def test_disk_only_tier_and_its_byte_bound(tmp_path: Path) -> None:
    tier = KVTier(ID_A, ram_bytes=0, disk_dir=tmp_path, disk_bytes=1_000)
    for seed in range(4):
        assert tier.put(toks(seed, 64), state(300, seed))
    # Each file is 300 state bytes plus its header and tokens: three do not fit in 1000.
    stats = tier.stats()
    assert stats.ram_entries == 0 and stats.disk_entries == 1 and stats.disk_bytes <= 1_000
    hit = tier.find([*toks(3, 64), 1], limit=64)
    assert hit is not None and tier.load(hit) == state(300, 3)
    assert tier.find([*toks(0, 64), 1], limit=64) is None


def test_longest_prefix_wins_within_the_limit_and_tiny_gains_are_ignored() -> None:
    tier = KVTier(ID_A, ram_bytes=10_000)
    base = toks(1, 100)
    short = base + toks(2, 50)  # shares 100 with the prompt
    long = base + toks(3, 200)  # shares 250 with the prompt
    tier.put(short, state(10, 1))
    tier.put(long, state(10, 2))
    prompt = base + toks(3, 150) + toks(4, 20)
    hit = tier.find(prompt, limit=len(prompt) - 1)
    assert hit is not None and hit.reuse == 250 and list(hit.tokens) == long
    # The limit caps what counts (the last prompt token is always decoded again).
    capped = tier.find(long[:120], limit=119)
    assert capped is not None and capped.reuse == 119
    # Already `have` most of it in a slot: the gain must reach MIN_RESTORE_TOKENS.
    assert tier.find(prompt, limit=len(prompt) - 1, have=250 - MIN_RESTORE_TOKENS + 1) is None
    assert tier.find(prompt, limit=len(prompt) - 1, have=250 - MIN_RESTORE_TOKENS) is not None
    # A prefix shorter than MIN_RESTORE_TOKENS is not worth a restore.
    assert tier.find(base[: MIN_RESTORE_TOKENS - 1] + [0] * 200, limit=250) is None
    assert tier.find(toks(9, 300), limit=299) is None


def test_cache_key_breaks_ties() -> None:
    tier = KVTier(ID_A, ram_bytes=10_000)
    base = toks(1, 100)
    tier.put([*base, 1], state(10), cache_key="a")
    tier.put([*base, 2], state(10), cache_key="b")
    for key in ("a", "b"):
        hit = tier.find([*base, 3, 3], limit=101, cache_key=key)
        assert hit is not None and hit.cache_key == key and hit.reuse == 100


def test_prefixes_of_an_entry_are_not_kept_twice() -> None:
    tier = KVTier(ID_A, ram_bytes=10_000)
    seq = toks(1, 300)
    assert tier.put(seq[:100], state(100))
    assert tier.put(seq[:200], state(200))  # replaces the shorter one
    assert [e.n_tokens for e in tier.entries()] == [200]
    assert not tier.put(seq[:150], state(150))  # held already
    assert tier.stats().ram_bytes == 200


def test_another_identity_and_damaged_files_are_deleted(tmp_path: Path) -> None:
    first = KVTier(ID_A, ram_bytes=0, disk_dir=tmp_path, disk_bytes=100_000)
    first.put(toks(1, 70), state(500, 1))
    first.put(toks(2, 70), state(500, 2))
    [damaged, kept] = sorted(tmp_path.iterdir())
    damaged.write_bytes(damaged.read_bytes()[:-10])  # truncated
    (tmp_path / ".x.tmp").write_bytes(b"an interrupted write")
    (tmp_path / "notes.txt").write_text("not ours")
    again = KVTier(ID_A, ram_bytes=0, disk_dir=tmp_path, disk_bytes=100_000)
    assert again.wait_indexed(5)
    assert [e.id for e in again.entries()] == [kept.stem]
    assert files(tmp_path) == {kept.name, "notes.txt"}
    other = KVTier(ID_B, ram_bytes=0, disk_dir=tmp_path, disk_bytes=100_000)
    assert other.wait_indexed(5)
    assert other.entries() == [] and files(tmp_path) == {"notes.txt"}


def test_restart_rebuilds_the_index(tmp_path: Path) -> None:
    first = KVTier(ID_A, ram_bytes=10_000, disk_dir=tmp_path, disk_bytes=100_000)
    first.put(toks(1, 100), state(1_000, 1), cache_key="resp_1")
    first.put(toks(2, 100), state(1_000, 2))
    assert files(tmp_path) == set()  # all in RAM until pushed out or closed
    first.close()
    assert len(files(tmp_path)) == 2
    second = KVTier(ID_A, ram_bytes=10_000, disk_dir=tmp_path, disk_bytes=100_000)
    assert second.wait_indexed(5)
    assert second.stats().disk_entries == 2 and second.stats().ram_entries == 0
    hit = second.find([*toks(1, 100), 1], limit=100)
    assert hit is not None and hit.reuse == 100 and hit.cache_key == "resp_1"
    assert second.load(hit) == state(1_000, 1)
    # A smaller disk bound at start keeps the most recently used file.
    third = KVTier(ID_A, ram_bytes=0, disk_dir=tmp_path, disk_bytes=1_500)
    assert third.wait_indexed(5)
    assert [e.id for e in third.entries()] == [hit.id]


def test_a_vanished_file_is_a_miss(tmp_path: Path) -> None:
    tier = KVTier(ID_A, ram_bytes=0, disk_dir=tmp_path, disk_bytes=100_000)
    tier.put(toks(1, 100), state(100))
    hit = tier.find([*toks(1, 100), 1], limit=100)
    assert hit is not None
    for p in tmp_path.iterdir():
        p.unlink()
    assert tier.load(hit) is None and tier.entries() == []
    assert tier.stats().disk_bytes == 0


def test_model_identity_covers_file_and_settings(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 3_000_000)
    one = model_identity(model, n_ctx=512, type_k=1)
    assert one == model_identity(model, type_k=1, n_ctx=512)
    assert one != model_identity(model, n_ctx=1024, type_k=1)
    model.write_bytes(b"x" * 2_999_999 + b"y")  # same name and size, other bytes
    assert one != model_identity(model, n_ctx=512, type_k=1)


def test_concurrent_use_leaks_nothing(tmp_path: Path) -> None:
    ram_limit, disk_limit = 3_000, 6_000
    tier = KVTier(ID_A, ram_bytes=ram_limit, disk_dir=tmp_path, disk_bytes=disk_limit)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(500):
                s = rng.randrange(12)
                tokens = toks(s, 64 + rng.randrange(3) * 40)
                if rng.random() < 0.5:
                    tier.put(tokens, state(400 + 100 * (s % 5), s))
                else:
                    hit = tier.find([*tokens, 0], limit=len(tokens))
                    if hit is not None:
                        data = tier.load(hit)
                        # Whatever came back is that entry's state, never another's.
                        assert data is None or data == state(len(data), hit.tokens[0] // 100_000)
                tier.stats()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    stats, entries = tier.stats(), tier.entries()
    in_ram = [e for e in entries if e.in_ram]
    on_disk = [e for e in entries if e.on_disk]
    assert stats.ram_bytes == sum(e.state_bytes for e in in_ram) <= ram_limit
    assert stats.ram_entries == len(in_ram) and stats.disk_entries == len(on_disk)
    assert files(tmp_path) == {f"{e.id}.kv" for e in on_disk}
    assert stats.disk_bytes == sum(p.stat().st_size for p in tmp_path.iterdir()) <= disk_limit
    assert all(e.in_ram or e.on_disk for e in entries)


def test_retained_entries_leave_ram_last() -> None:
    tier = KVTier(ID_A, ram_bytes=250)
    keep, a, b = toks(1, 100), toks(2, 100), toks(3, 100)
    assert tier.put(keep, state(100), retain=True)
    assert tier.put(a, state(100))
    assert tier.put(b, state(100))  # over the bound: `a` goes, though `keep` is older
    assert tier.find([*keep, 5], limit=100) is not None
    assert tier.find([*a, 5], limit=100) is None
    assert tier.find([*b, 5], limit=100) is not None


def test_retained_entries_are_written_to_disk_at_once_and_evicted_last(tmp_path: Path) -> None:
    size = 100 + 4 * 80 + 32 + 24  # state, tokens, header: one file
    tier = KVTier(ID_A, ram_bytes=10_000, disk_dir=tmp_path, disk_bytes=2 * size)
    keep = toks(1, 80)
    assert tier.put(keep, state(100), retain=True)
    assert len(files(tmp_path)) == 1  # on disk though RAM has room
    # Plain entries spill (at close) into the room left; the retained file stays.
    for seed in (2, 3, 4):
        assert tier.put(toks(seed, 80), state(100))
    tier.close()
    on_disk = {e.n_tokens for e in tier.entries() if e.on_disk}
    assert tier.stats().disk_entries == 2 and on_disk == {80}
    reopened = KVTier(ID_A, ram_bytes=10_000, disk_dir=tmp_path, disk_bytes=2 * size)
    assert reopened.wait_indexed(5)
    assert reopened.find([*keep, 9], limit=80) is not None


class GatedScan:
    """Holds the start-up scan before each file it reads until the test lets it go on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.allowed = threading.Semaphore(0)
        self.read: list[str] = []
        real = KVTier._index_file

        def gated(tier: KVTier, path: Path) -> object:
            assert self.allowed.acquire(timeout=10), "the test never let the scan go on"
            self.read.append(path.stem)
            return real(tier, path)

        monkeypatch.setattr(KVTier, "_index_file", gated)

    def allow(self, n: int) -> None:
        for _ in range(n):
            self.allowed.release()


def saved_dir(tmp_path: Path, seeds: range) -> list[str]:
    """A disk tier's directory after a run that saved `seeds` in order (ids, oldest first)."""
    first = KVTier(ID_A, ram_bytes=100_000, disk_dir=tmp_path, disk_bytes=100_000)
    for seed in seeds:
        assert first.put(toks(seed, 80), state(200, seed), cache_key=f"conv_{seed}")
    ids = [e.id for e in first.entries()]
    first.close()
    return ids


def test_the_index_is_read_in_the_background_newest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = saved_dir(tmp_path, range(1, 6))
    gate = GatedScan(monkeypatch)
    tier = KVTier(ID_A, ram_bytes=100_000, disk_dir=tmp_path, disk_bytes=100_000)
    # Constructed without reading a file: lookups see nothing yet, and a miss is only a miss.
    assert not tier.wait_indexed(0.05) and tier.entries() == []
    assert tier.find([*toks(5, 80), 1], limit=80) is None
    gate.allow(2)
    wait_for(lambda: len(tier.entries()) == 2)
    # The files used last before the restart come first.
    assert gate.read == [ids[4], ids[3]]
    hit = tier.find([*toks(4, 80), 1], limit=80)
    assert hit is not None and hit.cache_key == "conv_4" and tier.load(hit) == state(200, 4)
    assert tier.find([*toks(1, 80), 1], limit=80) is None  # not read yet
    gate.allow(3)
    assert tier.wait_indexed(5)
    assert gate.read == list(reversed(ids))
    assert tier.find([*toks(1, 80), 1], limit=80) is not None
    stats = tier.stats()
    assert stats.disk_entries == 5
    assert stats.disk_bytes == sum(p.stat().st_size for p in tmp_path.iterdir())


def test_saves_during_the_scan_are_newer_than_every_file_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = saved_dir(tmp_path, range(1, 4))
    size = (tmp_path / f"{ids[0]}.kv").stat().st_size
    gate = GatedScan(monkeypatch)
    # Room for three files: a new save and the two newest of the old ones.
    tier = KVTier(ID_A, ram_bytes=0, disk_dir=tmp_path, disk_bytes=3 * size)
    assert tier.put(toks(9, 80), state(200, 9))
    # The same tokens as an old file, saved again meanwhile: that save's file is the one.
    assert tier.put(toks(3, 80), state(200, 3))
    gate.allow(5)  # the listing may have seen the new files too
    assert tier.wait_indexed(5)
    kept = {e.id for e in tier.entries()}
    assert ids[2] in kept and ids[1] in kept and ids[0] not in kept  # the oldest went
    assert len(kept) == 3 and files(tmp_path) == {f"{i}.kv" for i in kept}
    stats = tier.stats()
    assert stats.disk_entries == 3
    assert stats.disk_bytes == sum(p.stat().st_size for p in tmp_path.iterdir())
    # The next save evicts the least recently used: an old file, not the new save.
    assert tier.put(toks(8, 80), state(200, 8))
    assert tier.find([*toks(9, 80), 1], limit=80) is not None
    assert tier.find([*toks(2, 80), 1], limit=80) is None


def test_close_during_the_scan_stops_it_and_still_writes_ram(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved_dir(tmp_path, range(1, 4))
    gate = GatedScan(monkeypatch)
    tier = KVTier(ID_A, ram_bytes=100_000, disk_dir=tmp_path, disk_bytes=100_000)
    assert tier.put(toks(7, 80), state(200, 7))
    gate.allow(1)
    wait_for(lambda: len(gate.read) == 1)
    closer = threading.Thread(target=tier.close)
    closer.start()
    gate.allow(1)  # the file being read when close came is the last one
    closer.join(5)
    assert not closer.is_alive()
    assert len(gate.read) <= 2
    # Nothing was deleted for being unread, and the RAM entry is on disk beside them.
    assert len(files(tmp_path)) == 4
    again = KVTier(ID_A, ram_bytes=0, disk_dir=tmp_path, disk_bytes=100_000)
    gate.allow(4)
    assert again.wait_indexed(5) and again.find([*toks(7, 80), 1], limit=80) is not None


def wait_for(check: Callable[[], bool], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.005)
