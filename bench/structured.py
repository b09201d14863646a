"""Structured output: respd with and without jump-forward decoding beside llama-server.

Four servers on the same GGUF, threads, context and slots: llama.cpp's llama-server, respd
on its defaults (`--jump-forward auto`: drafts forced text where a batched token measured
cheap enough; the measured ratio is printed), respd `--jump-forward on` and respd
`--jump-forward off`. Each is sent the
same requests: "invent a profile of <someone>" with a six-property JSON schema
(`response_format` json_schema on `/v1/chat/completions` everywhere; respd also on
`/v1/responses` with `text.format`, worded a little differently so that its prompts are not
cached from its Chat row), temperature 0, at concurrency 1 and 8. Each round uses
people no earlier round asked for, so no server answers from a cached prompt the others
never saw; the servers' order rotates every round. Figures: output tokens/s over the level
(every request's completion tokens / the level's wall time), TTFT p50, whether every output
parsed as JSON holding the six keys, and whether respd's outputs with and without
jump-forward are the same text. Printed: per round and the median over rounds, and the
ratios respd / llama-server and respd / respd without jump-forward.

    .venv/bin/python bench/structured.py --llama-server "$(scripts/llama-server.sh)"
    .venv/bin/python bench/structured.py --llama-server ... --rounds 1 --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench as common

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "email": {"type": "string"},
        "city": {"type": "string"},
        "active": {"type": "boolean"},
        "score": {"type": "number"},
    },
    "required": ["name", "age", "email", "city", "active", "score"],
    "additionalProperties": False,
}
JOBS = (
    "retired sailor", "young chemist", "baker", "pilot", "poet", "nurse", "chess coach",
    "gardener", "violin maker", "librarian", "glassblower", "train driver", "beekeeper",
    "architect", "potter", "lighthouse keeper", "marine biologist", "carpenter",
    "translator", "astronomer", "cheesemaker", "mountain guide", "tailor", "firefighter",
)  # fmt: skip
CITIES = (
    "Lisbon", "Osaka", "Lyon", "Nairobi", "Dublin", "Lima", "Riga", "Perth", "Oslo", "Quito",
    "Porto", "Hanoi", "Tunis", "Cork", "Bergen", "Malmo",
)  # fmt: skip
SERVERS = ("llama-server", "respd", "respd jf-on", "respd jf-off")


def prompts(round_no: int, n: int, verb: str = "Invent") -> list[str]:
    """`n` requests no other round sends; another `verb` makes them new to a server that
    has just answered the same people (respd's Responses rows follow its Chat rows)."""
    out = []
    for i in range(n):
        k = round_no * 131 + i
        job, city = JOBS[k % len(JOBS)], CITIES[(k // len(JOBS) + k) % len(CITIES)]
        out.append(
            f"{verb} a profile of a {job} from {city} as JSON with the keys name, age, "
            "email, city, active and score."
        )
    return out


def chat_extra() -> dict[str, Any]:
    return {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "profile", "strict": True, "schema": SCHEMA},
        }
    }


def responses_extra() -> dict[str, Any]:
    return {
        "text": {
            "format": {"type": "json_schema", "name": "profile", "strict": True, "schema": SCHEMA}
        },
        "store": False,
    }


def valid(text: str) -> bool:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(value, dict) and set(value) == set(SCHEMA["properties"])


async def level(
    server: common.Server, api: str, concurrency: int, batch: list[str], max_tokens: int
) -> dict[str, Any]:
    extra = chat_extra() if api == "chat" else responses_extra()
    results, wall, errors = await common.run_requests(
        server, api, concurrency, list(batch), max_tokens, extra
    )
    done = [r for r in results if r is not None]
    tokens = sum(r.tokens for r in done)
    return {
        "tps": tokens / wall if wall > 0 else 0.0,
        "ttft_p50": statistics.median(r.ttft for r in done) if done else float("nan"),
        "tokens": tokens,
        "valid": sum(valid(r.text) for r in done),
        "requests": len(batch),
        "errors": errors,
        "texts": [r.text if r is not None else None for r in results],
    }


def measured_ratio(server: common.Server) -> str:
    """What respd's `auto` measured (its /metrics gauge), as printed."""
    metrics = httpx.get(server.base_url + "/metrics", timeout=10).text
    for line in metrics.splitlines():
        if line.startswith("respd_engine_batch_token_cost_ratio"):
            return line.rsplit(" ", 1)[1]
    return "(not measured)"


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--llama-server", type=Path, required=True)
    p.add_argument("--model", type=Path, default=None, help="GGUF (default: embedded model)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx-size", type=int, default=1024, help="per-sequence context")
    p.add_argument("--parallel", type=int, default=8, help="slots on every server")
    p.add_argument("--levels", default="1,8")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument(
        "--requests", type=int, default=1, help="requests per level = this x level (at least 3)"
    )
    p.add_argument("--no-responses", action="store_true", help="skip respd's Responses rows")
    p.add_argument("--repack", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--poll", type=int, default=100, help="respd --poll (see bench.py --poll)")
    p.add_argument("--out", type=Path, default=common.ROOT / "bench/results/structured.json")
    args = p.parse_args()
    args.model = args.model or common.embedded_model_path()
    args.repack = (
        (not common.cpu_advertises_amx()) if args.repack == "auto" else args.repack == "on"
    )
    levels = [int(x) for x in args.levels.split(",")]
    log_dir = args.out.parent / "structured-logs"
    log_dir.mkdir(parents=True, exist_ok=True)

    servers = {
        "llama-server": common.start_llama_server(args, log_dir),
        "respd": common.start_respd(args, log_dir, extra=["--store", "memory"]),
        "respd jf-on": common.start_respd(
            args, log_dir, extra=["--store", "memory", "--jump-forward", "on"], name="respd-on"
        ),
        "respd jf-off": common.start_respd(
            args, log_dir, extra=["--store", "memory", "--jump-forward", "off"], name="respd-off"
        ),
    }
    for name, server in servers.items():
        print(f"{name}: {' '.join(server.cmd)}")
    rows: list[dict[str, Any]] = []
    try:
        for server in servers.values():  # warm each once (first-request setup)
            asyncio.run(level(server, "chat", 1, prompts(999, 1), 8))
        for r in range(args.rounds):
            order = list(SERVERS[r % len(SERVERS) :] + SERVERS[: r % len(SERVERS)])
            for conc in levels:
                batch = prompts(r * 10 + conc, max(3, conc * args.requests))
                for name in order:
                    apis = ["chat"] + (
                        ["responses"] if name == "respd" and not args.no_responses else []
                    )
                    for api in apis:
                        t = time.perf_counter()
                        sent = (
                            batch
                            if api == "chat"
                            else prompts(r * 10 + conc, len(batch), "Make up")
                        )
                        res = asyncio.run(level(servers[name], api, conc, sent, args.max_tokens))
                        res |= {"round": r, "server": name, "api": api, "concurrency": conc}
                        rows.append(res)
                        print(
                            f"round {r + 1} c={conc} {name:<13} {api:<9} "
                            f"{res['tps']:6.1f} tok/s  ttft p50 {res['ttft_p50'] * 1000:6.0f} ms  "
                            f"valid {res['valid']}/{res['requests']}  "
                            f"({time.perf_counter() - t:.0f}s)",
                            flush=True,
                        )
        ratio = measured_ratio(servers["respd"])
        print(f"respd (auto) measured a batched token at {ratio} of a step of one")
    finally:
        for server in servers.values():
            server.stop()
    report(rows, levels, args.rounds)
    args.out.write_text(json.dumps(rows, indent=2))


def report(rows: list[dict[str, Any]], levels: list[int], rounds: int) -> None:
    def pick(name: str, api: str, conc: int) -> list[dict[str, Any]]:
        return [x for x in rows if (x["server"], x["api"], x["concurrency"]) == (name, api, conc)]

    print(f"\nmedians over {rounds} rounds (tokens/s; ratio to llama-server and to jf-off)")
    print("| streams | server | API | tok/s | / llama-server | / jf-off | TTFT p50 | valid |")
    print("|---|---|---|---|---|---|---|---|")
    for conc in levels:
        llama = statistics.median(x["tps"] for x in pick("llama-server", "chat", conc))
        off = statistics.median(x["tps"] for x in pick("respd jf-off", "chat", conc))
        for name, api in (
            ("llama-server", "chat"),
            ("respd jf-off", "chat"),
            ("respd jf-on", "chat"),
            ("respd", "chat"),
            ("respd", "responses"),
        ):
            got = pick(name, api, conc)
            if not got:
                continue
            tps = statistics.median(x["tps"] for x in got)
            ttft = statistics.median(x["ttft_p50"] for x in got)
            ok = sum(x["valid"] for x in got)
            total = sum(x["requests"] for x in got)
            print(
                f"| {conc} | {name} | {api} | {tps:.1f} | {tps / llama:.2f}x | {tps / off:.2f}x "
                f"| {ttft * 1000:.0f} ms | {ok}/{total} |"
            )
        pairs = zip(pick("respd", "chat", conc), pick("respd jf-off", "chat", conc), strict=True)
        same = [
            a == b for on, off_ in pairs for a, b in zip(on["texts"], off_["texts"], strict=True)
        ]
        print(f"c={conc}: respd texts equal with and without jump-forward: {sum(same)}/{len(same)}")


if __name__ == "__main__":
    main()
