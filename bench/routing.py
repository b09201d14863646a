"""What falling back from a flaky provider costs: one model served by two providers, the
first of which refuses every other request with a 503.

This starts a respd backend (the embedded model), an HTTP proxy in this process that answers
503 to every other POST it receives (strict alternation, in arrival order) and forwards the
rest to that backend, and a front respd serving one model id from two entries: `flaky`
(through the proxy, listed first) and `healthy` (the backend directly). It then sends the
same short requests (16 output tokens, temperature 0) through the front, `--concurrency` at
a time, in two configurations, alternating which goes first, `--rounds` times:

- A: `provider: {"only": ["healthy"]}`, the latency with no flaky provider in the path;
- B: no provider object, so the default order: `flaky` first, `healthy` after a refusal.

It prints, per configuration, the errors the client saw, p50 / p95 latency over all rounds,
the median over rounds of B's p50 / A's p50, and the fallbacks the front counted for
`flaky` (its /v1/providers), beside those its `x-respd-provider` header named.

    .venv/bin/python bench/routing.py                 # 40 requests, 4 at a time, 3 rounds
    .venv/bin/python bench/routing.py --quick         # a smoke run: 12 requests, 1 round
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "bench/routed"
BACKEND_MODEL = "smollm2-135m-instruct"
PROMPTS = [
    "Say hello.",
    "Name a color.",
    "What is 2 + 2?",
    "Name a fruit.",
    "Give one word for happy.",
    "What is the capital of Italy?",
    "Name a planet.",
    "Say goodbye.",
]
# Headers that belong to one hop, not to the message the proxy passes on.
HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


class FlakyProxy:
    """Refuses every other POST with a 503 and forwards the rest (and every GET, so the
    front's model listing at startup is not what fails)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.posts = 0
        self.refused = 0
        self.client: httpx.AsyncClient | None = None

    async def forward(self, request: Request) -> Response:
        if request.method == "POST":
            self.posts += 1
            if self.posts % 2 == 1:
                self.refused += 1
                error = {"message": "flaky provider: try another", "type": "server_error"}
                return JSONResponse({"error": error}, status_code=503)
        if self.client is None:  # made on the proxy's own event loop, which owns it
            self.client = httpx.AsyncClient(base_url=self.target, timeout=None)
        upstream = await self.client.send(
            self.client.build_request(
                request.method,
                request.url.path,
                params=request.query_params,
                headers=[(k, v) for k, v in request.headers.items() if k not in HOP],
                content=await request.body(),
            ),
            stream=True,
        )
        return StreamingResponse(
            upstream.aiter_raw(),
            status_code=upstream.status_code,
            headers={k: v for k, v in upstream.headers.items() if k not in HOP},
            background=BackgroundTask(upstream.aclose),
        )


@contextmanager
def serve_proxy(proxy: FlakyProxy) -> Iterator[str]:
    """The proxy on its own thread and event loop, so the measuring loop never waits on it."""
    app = Starlette(routes=[Route("/{path:path}", proxy.forward, methods=["GET", "POST"])])
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def respd(flags: list[str], data_dir: Path, log: Path) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "respd", "serve", "--port", str(port), "--store", "memory"]
    cmd += ["--data-dir", str(data_dir), *flags]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise SystemExit(f"respd exited:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        else:
            raise SystemExit(f"respd did not start with {flags}")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@dataclass
class Run:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    via: dict[str, list[float]] = field(default_factory=dict)  # by x-respd-provider
    fallbacks: int = 0  # the front's count for `flaky`, over this run

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies)


async def measure(front: str, n: int, concurrency: int, provider: dict[str, Any] | None) -> Run:
    run = Run()
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=front, timeout=300) as client:

        async def one(i: int) -> None:
            body: dict[str, Any] = {
                "model": MODEL,
                "input": PROMPTS[i % len(PROMPTS)],
                "max_output_tokens": 16,
                "temperature": 0,
            }
            if provider is not None:
                body["provider"] = provider
            async with gate:
                started = time.perf_counter()
                try:
                    r = await client.post("/v1/responses", json=body)
                except httpx.HTTPError:
                    run.errors += 1
                    return
                elapsed = time.perf_counter() - started
            if r.status_code != 200 or r.json().get("status") == "failed":
                run.errors += 1
                return
            run.latencies.append(elapsed)
            run.via.setdefault(r.headers.get("x-respd-provider", "?"), []).append(elapsed)

        await asyncio.gather(*(one(i) for i in range(n)))
    return run


def flaky_stats(front: str) -> dict[str, Any]:
    rows = httpx.get(front + "/v1/providers", timeout=10).json()["data"]
    return next(r for r in rows if r["provider"] == "flaky")


def p50_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--requests", type=int, default=40, help="requests per configuration a round")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="12 requests, 1 round")
    p.add_argument("--threads", type=int, default=2, help="the backend's decode threads")
    args = p.parse_args()
    if args.quick:
        args.requests, args.rounds = 12, 1
    configs: dict[str, dict[str, Any] | None] = {
        "A healthy only": {"only": ["healthy"]},
        "B flaky first, fallback": None,
    }
    totals = {name: Run() for name in configs}
    ratios: list[float] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        backend_flags = ["--threads", str(args.threads), "--ctx-size", "2048", "--parallel", "4"]
        with (
            respd(backend_flags, tmp / "backend", tmp / "backend.log") as backend,
            serve_proxy(proxy := FlakyProxy(backend)) as flaky,
        ):
            entry = f"model={BACKEND_MODEL},model_id={MODEL}"
            front_flags = [
                "--engine", "openai",
                "--upstream", f"flaky={flaky}/v1,{entry},provider=flaky",
                "--upstream", f"healthy={backend}/v1,{entry},provider=healthy",
            ]  # fmt: skip
            with respd(front_flags, tmp / "front", tmp / "front.log") as front:
                for provider in configs.values():  # warm the slots and both paths
                    asyncio.run(measure(front, 8, args.concurrency, provider))
                for round_no in range(args.rounds):
                    order = list(configs) if round_no % 2 == 0 else list(reversed(configs))
                    p50s = {}
                    for name in order:
                        before = flaky_stats(front)["fallbacks"]
                        run = asyncio.run(
                            measure(front, args.requests, args.concurrency, configs[name])
                        )
                        run.fallbacks = flaky_stats(front)["fallbacks"] - before
                        total = totals[name]
                        total.latencies += run.latencies
                        total.errors += run.errors
                        total.fallbacks += run.fallbacks
                        for via, seconds in run.via.items():
                            total.via.setdefault(via, []).extend(seconds)
                        p50s[name] = run.p50 if run.latencies else float("nan")
                        print(
                            f"round {round_no + 1} {name:<24} p50 {p50s[name] * 1000:7.0f} ms"
                            f"  errors {run.errors}  fallbacks {run.fallbacks}",
                            flush=True,
                        )
                    a, b = (p50s[name] for name in configs)
                    ratios.append(b / a)
                final = flaky_stats(front)
    report(args, totals, ratios, proxy, final)


def report(
    args: argparse.Namespace,
    totals: dict[str, Run],
    ratios: list[float],
    proxy: FlakyProxy,
    flaky: dict[str, Any],
) -> None:
    print(f"load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(
        f"\n{args.requests} requests x {args.rounds} rounds per configuration, "
        f"{args.concurrency} at a time; proxy refused {proxy.refused} of {proxy.posts} POSTs"
    )
    print("| configuration            | requests | errors | p50 ms | p95 ms | fallbacks |")
    print("|--------------------------|----------|--------|--------|--------|-----------|")
    rows = []
    for name, run in totals.items():
        n = len(run.latencies) + run.errors
        p50 = run.p50 * 1000 if run.latencies else float("nan")
        tail = p95(run.latencies) * 1000 if len(run.latencies) > 1 else float("nan")
        print(f"| {name:<24} | {n:>8} | {run.errors:>6} | {p50:>6.0f} | {tail:>6.0f} |", end="")
        print(f" {run.fallbacks:>9} |")
        rows.append({"name": name, "requests": n, "errors": run.errors, "p50_ms": p50})
        answered = {via: len(seconds) for via, seconds in run.via.items()}
        rows[-1] |= {"p95_ms": tail, "fallbacks": run.fallbacks, "answered_by": answered}
    median = statistics.median(ratios)
    print(
        f"median p50 ratio B/A over rounds: {median:.2f} ({', '.join(f'{r:.2f}' for r in ratios)})"
    )
    # B's two paths apart: straight through `flaky`, and refused by it then `healthy`.
    for name, run in totals.items():
        for via, seconds in sorted(run.via.items()):
            print(f"{name}: {len(seconds)} answered by {via!r}, p50 {p50_ms(seconds):.0f} ms")
    print(f"flaky at the end: circuit {flaky['circuit']}, failed {flaky['failed']}, ", end="")
    print(f"succeeded {flaky['succeeded']}")
    ok = totals["B flaky first, fallback"].errors == 0 and median <= 1.2
    print("target (B: 0 errors, p50 within 1.2x of A):", "met" if ok else "NOT met")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    result = {"rows": rows, "ratios": ratios, "median_ratio": median, "flaky": flaky}
    (out / "routing.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
