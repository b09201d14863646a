"""Latency of one short request on a host that other work shares.

Each server configuration is started, warmed up, then sent the same 24-token request
`--runs` times one after another with the machine as it is ("quiet"), and again while one
busy process (a Python loop) competes for a core ("busy"). Printed per configuration:
p50 / p95 / max of the request's wall time in both phases, and the busy p95 over the quiet
p50 (the target is at most 3). respd configurations come from `--respd` (its flags, once
each); llama.cpp's own llama-server, given with `--llama-server`, runs beside them on the
same model with `--llama-threads` threads (comma-separated values: one run each).

    python bench/shared_host.py --respd "--threads 1" --respd "--threads 2 --poll 50" \\
        --llama-server ~/.cache/respd/llama-server-0.3.36/build/bin/llama-server
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Write the numbers from one to fifty in words, separated by commas."
MAX_TOKENS = 24


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def embedded_model() -> Path:
    sys.path.insert(0, str(ROOT / "src"))
    from respd.config.engine import embedded_model_path

    return embedded_model_path()


@contextlib.contextmanager
def running(cmd: list[str], port: int, env: dict[str, str] | None = None) -> Iterator[str]:
    """`cmd` started, until it answers /health; its base URL."""
    log = Path(tempfile.mkstemp(prefix="shared-host-", suffix=".log")[1])
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited: {log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def respd_request(http: httpx.Client) -> int:
    r = http.post(
        "/v1/responses",
        json={
            "model": "default",
            "input": PROMPT,
            "max_output_tokens": MAX_TOKENS,
            "temperature": 0,
        },
    )
    r.raise_for_status()
    return int(r.json()["usage"]["output_tokens"])


def llama_request(http: httpx.Client) -> int:
    r = http.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
        },
    )
    r.raise_for_status()
    return int(r.json()["usage"]["completion_tokens"])


@contextlib.contextmanager
def busy_process() -> Iterator[None]:
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        proc.kill()
        proc.wait()


def timed(send: Callable[[httpx.Client], int], http: httpx.Client, runs: int) -> dict[str, Any]:
    seconds, tokens = [], []
    for _ in range(runs):
        started = time.perf_counter()
        tokens.append(send(http))
        seconds.append(time.perf_counter() - started)
    seconds.sort()
    return {
        "p50": statistics.median(seconds),
        "p95": seconds[min(len(seconds) - 1, round(0.95 * (len(seconds) - 1)))],
        "max": seconds[-1],
        "tokens": statistics.median(tokens),
    }


def measure(
    label: str,
    cmd: list[str],
    port: int,
    send: Callable[[httpx.Client], int],
    runs: int,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    with running(cmd, port, env) as base, httpx.Client(base_url=base, timeout=300) as http:
        for _ in range(3):
            send(http)
        quiet = timed(send, http, runs)
        with busy_process():
            busy = timed(send, http, runs)
    ratio = busy["p95"] / quiet["p50"]
    return {"label": label, "quiet": quiet, "busy": busy, "busy_p95_over_quiet_p50": ratio}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--respd",
        action="append",
        default=[],
        help="respd serve flags, after any NAME=VALUE environment (repeatable)",
    )
    p.add_argument("--llama-server", type=Path, help="llama-server binary")
    p.add_argument("--llama-threads", default="1,2", help="llama-server --threads values")
    p.add_argument("--llama-env", action="append", default=[], help="NAME=VALUE for llama-server")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--json", type=Path, help="write the results here too")
    args = p.parse_args()
    model = embedded_model()
    results = []
    for flags in args.respd or [""]:
        port = free_port()
        words = shlex.split(flags)
        env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
        words = [w for w in words if w.startswith("-") or "=" not in w]
        cmd = [
            sys.executable,
            "-m",
            "respd",
            "serve",
            "--port",
            str(port),
            "--store",
            "memory",
            "--model-alias",
            "default",
            *words,
        ]
        label = f"respd {flags}".strip()
        results.append(measure(label, cmd, port, respd_request, args.runs, env))
        print(json.dumps(results[-1]), flush=True)
    if args.llama_server is not None:
        env = dict(e.split("=", 1) for e in args.llama_env)
        for threads in args.llama_threads.split(","):
            port = free_port()
            cmd = [
                str(args.llama_server),
                "-m",
                str(model),
                "--port",
                str(port),
                "--threads",
                threads,
                "--threads-batch",
                threads,
                "-c",
                "4096",
                "--parallel",
                "4",
            ]
            label = f"llama-server --threads {threads}" + "".join(
                f" {k}={v}" for k, v in env.items()
            )
            results.append(measure(label, cmd, port, llama_request, args.runs, env))
            print(json.dumps(results[-1]), flush=True)
    head = ("quiet p50", "p95", "busy p50", "p95", "max", "ratio")
    print(f"\n{'configuration':44}" + "".join(f" {h:>9}" for h in head))
    for r in results:
        q, b = r["quiet"], r["busy"]
        print(
            f"{r['label']:44} {q['p50']:9.3f} {q['p95']:7.3f} {b['p50']:9.3f} {b['p95']:7.3f} "
            f"{b['max']:7.3f} {r['busy_p95_over_quiet_p50']:6.2f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
