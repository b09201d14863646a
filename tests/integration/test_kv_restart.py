"""A conversation outlives a restart of the server with its KV: with `--kv-cache-dir` and a
sqlite store, the turn chained (`previous_response_id`) after a SIGTERM and a new start
restores its history's KV from the disk tier instead of prefilling it."""

from __future__ import annotations

from pathlib import Path

from tests.support.servers import RespdServer, start_server
from tests.support.stateful import create, engine_stats

FACTS = " ".join(
    f"Note {i}: the {c} boat in harbour {i} sails every {d} at dawn."
    for i, (c, d) in enumerate(
        [("red", "Monday"), ("blue", "Tuesday"), ("green", "Friday"), ("white", "Sunday")] * 5
    )
)


def _start(tmp_path: Path) -> RespdServer:
    return start_server(
        tmp_path,
        "--data-dir",
        str(tmp_path / "data"),
        "--store",
        "sqlite",
        "--kv-cache-dir",
        str(tmp_path / "kv"),
        "--parallel",
        "2",
        preset="small",
    )


def test_a_chained_turn_after_a_restart_restores_its_history(tmp_path: Path) -> None:
    first = _start(tmp_path)
    try:
        client = first.client()
        a = create(client, f"Read these notes.\n{FACTS}\nWhich boat sails on Friday?")
        b = create(client, "And on Sunday?", previous_response_id=a.id)
        assert a.usage is not None and b.usage is not None
        assert b.usage.input_tokens > a.usage.input_tokens >= 300
        # The second turn continued the first one's slot.
        assert b.usage.input_tokens_details.cached_tokens >= a.usage.input_tokens
    finally:
        first.stop()  # SIGTERM: the slots and the memory tier are written to the disk tier
    first.assert_no_5xx()
    assert any((tmp_path / "kv").rglob("*.kv"))

    second = _start(tmp_path)
    try:
        client = second.client()
        c = create(client, "And on Monday?", previous_response_id=b.id)
        assert c.usage is not None
        # Everything up to B's answer came back from disk: only C's own turn was prefilled.
        assert c.usage.input_tokens_details.cached_tokens >= b.usage.input_tokens, c.usage
        assert engine_stats(second.base_url).get("kv_restored_tokens", 0) >= b.usage.input_tokens
    finally:
        second.stop()
    second.assert_no_5xx()
