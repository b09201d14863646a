"""KV that outlives a restart and outnumbers RAM: respd's disk KV tier beside llama.cpp's
llama-server and its host-memory prompt cache, same GGUF, threads and slots, in one run.

Two cases, each on fresh instances of both servers, the servers' order alternating by round:

- restart: conversations whose first turn carries a long context document (~1,550 tokens,
  unique to each), built up over a few turns; then the server is stopped (SIGTERM) and
  started again, and every conversation takes its next turn. respd chains turns with
  `previous_response_id` (stored in sqlite, which survives the restart) and keeps its KV
  tier in a `--kv-cache-dir` kept across the restart; llama-server gets each
  conversation's whole history on `/v1/chat/completions` with `cache_prompt` (its prompt
  cache is in RAM and starts empty). Reported: TTFT p50/p95 of the turns after the restart.
- many: 64 conversations x 4 turns over 4 slots, interleaved (turn k of every conversation
  before turn k+1 of any), 4 at a time, each opening with a ~400-token context document;
  respd with a RAM tier far smaller than the
  conversations' KV (`--kv-cache-ram-mb`) and a disk tier, llama-server with `--cache-ram`
  at its default (8 GiB). Reported: TTFT p50/p95 over turns 2-4.

Neither case sends `prompt_cache_key`: respd keys a chain by its first response itself.
Both servers get one short warm-up request after each start. Every turn is a streamed
request, temperature 0, 24 output tokens at most; TTFT is the time from sending it to the
first chunk carrying text (the client of `bench.py`). Printed: each round's figures, the
median over rounds and the respd / llama-server ratios, and each server's command line.
JSON goes to `bench/results/kv_restart.json`.

    export RESPD_TEST_LLAMA_SERVER=$(scripts/llama-server.sh)
    .venv/bin/python bench/kv_restart.py                 # 3 rounds, both cases
    .venv/bin/python bench/kv_restart.py --quick         # 1 small round
    .venv/bin/python bench/kv_restart.py --only many --rounds 1
    .venv/bin/python bench/kv_restart.py --report        # the tables of the last runs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench as common
from bench import RequestResult, Server, StreamError
from respd.config import embedded_model_path

ROOT = common.ROOT
TURNS = [
    "Summarise the context in one sentence.",
    "Which crate holds the most items?",
    "List the ports mentioned so far.",
    "Rewrite your last answer more formally.",
    "Name one risk for this project.",
    "Give the project a short title.",
]
COLOURS = ["red", "blue", "green", "grey", "amber", "white", "black", "violet"]
GOODS = ["lamps", "ropes", "barrels", "maps", "nails", "sails", "tiles", "clocks"]
PORTS = ["Avonmouth", "Brest", "Cadiz", "Dunkirk", "Esbjerg", "Faro", "Genoa", "Hull"]
CASES = ("restart", "many")


def context_doc(conv: int, notes: int) -> str:
    """A context document of `notes` lines (~31 tokens each), unique from its first words."""
    rng = random.Random(conv)
    lines = [f"Context for project {conv} ({rng.choice(PORTS)} office)."]
    for j in range(notes):
        lines.append(
            f"Note {j}: the {rng.choice(COLOURS)} crate {conv}-{j} holds {rng.randint(2, 900)} "
            f"{rng.choice(GOODS)} and ships from {rng.choice(PORTS)} on day {rng.randint(1, 28)}."
        )
    return " ".join(lines)


@dataclass
class Conversations:
    """Conversations driven turn by turn on one server: through `previous_response_id` on
    respd, with the whole history on llama-server's chat completions."""

    server: Server
    api: str
    docs: list[str]
    max_tokens: int
    concurrency: int
    history: list[list[dict[str, Any]]] = field(default_factory=list)
    previous: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    turns_done: int = 0

    def __post_init__(self) -> None:
        self.history = [[{"role": "system", "content": doc}] for doc in self.docs]
        self.previous = [""] * len(self.docs)

    async def turn(self) -> list[RequestResult]:
        """The next turn of every conversation, `concurrency` at a time."""
        k = self.turns_done
        sem = asyncio.Semaphore(self.concurrency)

        async def one(i: int) -> RequestResult | None:
            user = {"role": "user", "content": TURNS[k % len(TURNS)]}
            async with sem:
                try:
                    return await self._send(i, k, user)
                except (StreamError, RuntimeError) as exc:
                    self.errors.append(f"conversation {i} turn {k + 1}: {exc}")
                    return None

        done = await asyncio.gather(*(one(i) for i in range(len(self.docs))))
        self.turns_done += 1
        return [r for r in done if r is not None]

    async def _send(self, i: int, k: int, user: dict[str, Any]) -> RequestResult:
        if self.api == "responses":
            body: dict[str, Any] = {"store": True}
            if k:
                body["previous_response_id"] = self.previous[i]
            prompt = user["content"] if k else [*self.history[i], user]
            r = await common.stream_responses(self.server, prompt, self.max_tokens, body)
            if not r.response_id:
                raise RuntimeError("the response did not complete")
            self.previous[i] = r.response_id
            return r
        self.history[i].append(user)
        extra = {"cache_prompt": True}
        r = await common.stream_chat(self.server, self.history[i], self.max_tokens, extra)
        self.history[i].append({"role": "assistant", "content": r.text})
        return r


def summary(results: list[RequestResult]) -> dict[str, Any]:
    ttfts = [r.ttft for r in results]
    known = [r for r in results if r.cached_tokens is not None]
    inputs = sum(r.input_tokens for r in known)
    return {
        "turns": len(results),
        "ttft_p50": common.percentile(ttfts, 0.5) if ttfts else None,
        "ttft_p95": common.percentile(ttfts, 0.95) if ttfts else None,
        "input_tokens_mean": statistics.mean(r.input_tokens for r in results) if results else None,
        "cached_fraction": sum(r.cached_tokens or 0 for r in known) / inputs if inputs else None,
    }


def warm_up(server: Server) -> None:
    asyncio.run(common.stream_chat(server, "Say hi.", 4))


def respd_flags(tmp: Path, case: str, args: argparse.Namespace) -> list[str]:
    flags = [
        "--store",
        "sqlite",
        "--data-dir",
        str(tmp / "data"),
        "--kv-cache-dir",
        str(tmp / "kv"),
    ]
    if case == "many":
        flags += ["--kv-cache-ram-mb", str(args.many_ram_mb)]
    return flags


def starter(name: str, args: argparse.Namespace, tmp: Path, case: str) -> Callable[[], Server]:
    """How to start (and, for the restart case, start again) one server for `case`."""
    log_dir = args.out.parent / "kv_restart-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    if name == "respd":
        extra = respd_flags(tmp, case, args)
        return lambda: common.start_respd(
            args, log_dir, parallel=args.slots, extra=extra, name=f"respd {case}"
        )
    help_text = common.help_text([str(args.llama_server)])
    extra = ["--cache-reuse", "256"] if "--cache-reuse" in help_text else []
    return lambda: common.start_llama_server(
        args, log_dir, parallel=args.slots, extra=extra, name=f"llama-server {case}"
    )


def run_restart(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Build the conversations up, restart the server, time every conversation's next turn."""
    start = starter(name, args, tmp, "restart")
    api = "responses" if name == "respd" else "chat"
    docs = [context_doc(i, args.restart_notes) for i in range(args.restart_conversations)]
    server = start()
    commands = [server.cmd]
    try:
        warm_up(server)
        convs = Conversations(server, api, docs, args.max_tokens, args.slots)
        before = [asyncio.run(convs.turn()) for _ in range(args.restart_turns)]
    finally:
        server.stop()
    server = start()
    try:
        warm_up(server)
        convs.server = server
        t0 = time.perf_counter()
        after = asyncio.run(convs.turn())
        wall = time.perf_counter() - t0
    finally:
        server.stop()
    return {
        "commands": commands,
        "turn1": summary(before[0]),
        "before_restart": summary([r for turn in before[1:] for r in turn]),
        "after_restart": summary(after),
        "after_restart_wall_s": wall,
        "errors": len(convs.errors),
        "first_error": convs.errors[0] if convs.errors else "",
    }


def run_many(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Every conversation's turns, interleaved, over the server's slots."""
    start = starter(name, args, tmp, "many")
    api = "responses" if name == "respd" else "chat"
    docs = [context_doc(i, args.many_notes) for i in range(args.many_conversations)]
    server = start()
    try:
        warm_up(server)
        convs = Conversations(server, api, docs, args.max_tokens, args.slots)
        t0 = time.perf_counter()
        turns = [asyncio.run(convs.turn()) for _ in range(args.many_turns)]
        wall = time.perf_counter() - t0
        rss = server.peak_rss_mib()
    finally:
        server.stop()
    return {
        "commands": [server.cmd],
        "turn1": summary(turns[0]),
        "later": summary([r for turn in turns[1:] for r in turn]),
        "by_turn_p50": [summary(turn)["ttft_p50"] for turn in turns],
        "wall_s": wall,
        "peak_rss_mib": rss,
        "errors": len(convs.errors),
        "first_error": convs.errors[0] if convs.errors else "",
    }


# (case, the summary compared, how a case runs on one server)
RUNNERS: dict[str, tuple[str, Callable[[str, argparse.Namespace, Path], dict[str, Any]]]] = {
    "restart": ("after_restart", run_restart),
    "many": ("later", run_many),
}


def ms(seconds: float | None) -> str:
    return f"{seconds * 1000:.0f}ms" if seconds is not None else "-"


def median_of(rounds: list[dict[str, Any]], key: str, stat: str) -> float | None:
    values = [r[key][stat] for r in rounds if r.get(key, {}).get(stat) is not None]
    return statistics.median(values) if values else None


def report(case: str, rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Print each round and the medians of one case; returns the medians."""
    key = RUNNERS[case][0]
    over = "the turns after the restart" if case == "restart" else "turns 2-4"
    print(f"\n{case}: TTFT over {over}")
    # Beside the restart's turns: the same conversations' turns 2.. before it (warm).
    head = ("round", "server", "TTFT p50", "TTFT p95", "turn-1 p50", "warm p50", "cached")
    print("{:>5} {:<13} {:>9} {:>9} {:>10} {:>9} {:>7}".format(*head))
    for name in ("respd", "llama-server"):
        for n, r in enumerate(rounds[name], 1):
            if "error" in r:
                print(f"{n:>5} {name:<13} {r['error']}")
                continue
            s = r[key]
            frac = f"{s['cached_fraction']:.0%}" if s["cached_fraction"] is not None else "-"
            warm = ms(r["before_restart"]["ttft_p50"]) if "before_restart" in r else "-"
            print(
                f"{n:>5} {name:<13} {ms(s['ttft_p50']):>9} {ms(s['ttft_p95']):>9} "
                f"{ms(r['turn1']['ttft_p50']):>10} {warm:>9} {frac:>7}"
                + (f"  ({r['errors']} errors: {r['first_error']})" if r["errors"] else "")
            )
    medians: dict[str, Any] = {}
    for name in ("respd", "llama-server"):
        medians[name] = {
            stat: median_of(rounds[name], key, stat) for stat in ("ttft_p50", "ttft_p95")
        }
        print(
            f"{'med':>5} {name:<13} {ms(medians[name]['ttft_p50']):>9} "
            f"{ms(medians[name]['ttft_p95']):>9}"
        )
    for stat in ("ttft_p50", "ttft_p95"):
        a, b = medians["respd"][stat], medians["llama-server"][stat]
        medians[f"ratio_{stat}"] = a / b if a and b else None
    print(
        f"respd / llama-server: TTFT p50 {medians['ratio_ttft_p50'] or float('nan'):.2f}x, "
        f"p95 {medians['ratio_ttft_p95'] or float('nan'):.2f}x"
    )
    return medians


def run_case(
    case: str, args: argparse.Namespace, save: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Every round of `case`; what is done so far is `save`d after each server's run, so a
    run cut short keeps its finished rounds."""
    rounds: dict[str, list[dict[str, Any]]] = {"respd": [], "llama-server": []}
    commands: dict[str, str] = {}
    for n in range(args.rounds):
        order = ["respd", "llama-server"] if n % 2 == 0 else ["llama-server", "respd"]
        for name in order:
            print(f"{case} round {n + 1}: {name}", flush=True)
            with tempfile.TemporaryDirectory(prefix="respd-kv-bench-") as tmp:
                try:
                    result = RUNNERS[case][1](name, args, Path(tmp))
                except common.CASE_ERRORS as exc:
                    result = {"error": f"{type(exc).__name__}: {exc}"}
            rounds[name].append(result)
            if "commands" in result:
                commands[name] = shlex.join(result["commands"][0])
            got = result.get(RUNNERS[case][0], {})
            p50, p95 = ms(got.get("ttft_p50")), ms(got.get("ttft_p95"))
            print(f"  TTFT p50 {p50}, p95 {p95}", flush=True)
            save({"rounds": rounds, "commands": commands})
    for name, cmd in commands.items():
        print(f"{name}: {cmd}")
    return {"rounds": rounds, "commands": commands, "medians": report(case, rounds)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--llama-server",
        type=Path,
        default=os.environ.get("RESPD_TEST_LLAMA_SERVER"),
        help="llama-server binary (default: $RESPD_TEST_LLAMA_SERVER)",
    )
    p.add_argument("--model", type=Path, default=None, help="GGUF (default: embedded model)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--slots", type=int, default=4, help="slots on both servers, and concurrency")
    p.add_argument("--ctx-size", type=int, default=4096, help="per-slot context")
    p.add_argument("--max-tokens", type=int, default=24, help="output tokens per turn")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="one small round")
    p.add_argument("--only", default=",".join(CASES), help="cases: restart,many")
    g = p.add_argument_group("restart")
    g.add_argument("--restart-conversations", type=int, default=8)
    g.add_argument("--restart-turns", type=int, default=3, help="turns before the restart")
    g.add_argument("--restart-notes", type=int, default=50, help="context lines (~31 tokens)")
    g = p.add_argument_group("many")
    g.add_argument("--many-conversations", type=int, default=64)
    g.add_argument("--many-turns", type=int, default=4)
    g.add_argument("--many-notes", type=int, default=12, help="context lines (~31 tokens)")
    g.add_argument("--many-ram-mb", type=int, default=64, help="respd's --kv-cache-ram-mb")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "kv_restart.json")
    p.add_argument("--report", action="store_true", help="print the tables of --out; run nothing")
    args = p.parse_args()
    if args.report:
        saved = json.loads(args.out.read_text())
        for case in CASES:
            if case in saved:
                for name, cmd in saved[case]["commands"].items():
                    print(f"{name}: {cmd}")
                report(case, saved[case]["rounds"])
        return
    if args.llama_server is None:
        p.error("--llama-server or $RESPD_TEST_LLAMA_SERVER is needed")
    cases = args.only.split(",")
    if set(cases) - set(CASES):
        p.error(f"--only: unknown case(s) {','.join(sorted(set(cases) - set(CASES)))}")
    if args.quick:
        args.rounds = 1
        args.restart_conversations, args.restart_notes = 4, 30
        args.many_conversations, args.many_notes = 12, 12
    args.model = args.model or embedded_model_path()
    args.repack = not common.cpu_advertises_amx()
    # A run of some cases keeps the others' results already in the file.
    out: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for case in cases:

        def save(result: dict[str, Any], case: str = case) -> None:
            out[case] = {
                **result,
                "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                "settings": {k: str(v) for k, v in vars(args).items()},
            }
            args.out.write_text(json.dumps(out, indent=2))

        save(run_case(case, args, save))
    print(f"\nJSON: {args.out}")


if __name__ == "__main__":
    main()
