"""Side-by-side throughput benchmark: respd vs llama.cpp's llama-server, same GGUF, same run.

Both servers get the same model, threads, context and parallel slots. The same prompts are
streamed through each at every concurrency level (chat completions on both, the Responses
API on respd too), and the table reports ratios, which hold up on a noisy machine far
better than absolute numbers. It also measures the in-process ceiling (llama-cpp-python
decoding with no server) and a prefix-cache case (a 3-turn previous_response_id chain).

Build llama-server from the llama.cpp sources vendored in the llama-cpp-python sdist of
the installed version (see README, "Benchmark"), then:

    python bench/bench.py --llama-server /path/to/llama-server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from respd.config import Settings  # noqa: E402
from respd.engines.llamacpp import cpu_advertises_amx  # noqa: E402

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how rain forms, step by step.",
    "Describe a busy market in the morning.",
    "Write a letter to a friend about a trip to the mountains.",
    "List some tips for learning to cook.",
    "Describe the life cycle of a butterfly.",
    "Write a poem about the sea.",
    "Explain why the sky is blue.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    name: str
    process: subprocess.Popen[bytes]
    base_url: str
    model: str

    def peak_rss_mib(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()


def wait_healthy(server: Server, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.process.returncode}")
        try:
            if httpx.get(server.base_url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{server.name} did not become healthy")


def start_respd(args: argparse.Namespace, log_dir: Path) -> Server:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "respd",
        "serve",
        "--port",
        str(port),
        "--model",
        str(args.model),
        "--model-alias",
        "bench",
        "--ctx-size",
        str(args.ctx_size),
        "--threads",
        str(args.threads),
        "--parallel",
        str(args.parallel),
        "--repack",
        "on" if args.repack else "off",
        "--log-level",
        "warning",
    ]
    log = (log_dir / "respd.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    server = Server("respd", proc, f"http://127.0.0.1:{port}", "bench")
    wait_healthy(server)
    return server


def start_respd_upstream(args: argparse.Namespace, log_dir: Path, upstream: Server) -> Server:
    """respd with no model of its own, in front of `upstream` (`--engine openai`)."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "respd", "serve",
        "--port", str(port),
        "--engine", "openai",
        "--upstream-url", upstream.base_url + "/v1",
        "--upstream-model", upstream.model,
        "--model-alias", "bench",
        "--ctx-size", str(args.ctx_size),
        "--parallel", str(args.parallel),
        "--store", "memory",
        "--log-level", "warning",
    ]  # fmt: skip
    log = (log_dir / "respd-upstream.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    server = Server("respd→llama", proc, f"http://127.0.0.1:{port}", "bench")
    wait_healthy(server)
    return server


def start_llama_server(args: argparse.Namespace, log_dir: Path) -> Server:
    port = free_port()
    cmd = [
        str(args.llama_server),
        "-m",
        str(args.model),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "-t",
        str(args.threads),
        "-tb",
        str(args.threads),
        "-c",
        str(args.ctx_size * args.parallel),
        "-np",
        str(args.parallel),
        "-b",
        "512",
        "-ub",
        "512",
        "--alias",
        "bench",
        "--no-webui",
        "--repack" if args.repack else "--no-repack",
    ]
    log = (log_dir / "llama-server.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    server = Server("llama-server", proc, f"http://127.0.0.1:{port}", "bench")
    wait_healthy(server)
    return server


@dataclass
class RequestResult:
    ttft: float
    duration: float
    tokens: int


async def stream_chat(
    client: httpx.AsyncClient, server: Server, prompt: str, max_tokens: int
) -> RequestResult:
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = None
    tokens = 0
    async with client.stream("POST", server.base_url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if first is None and any(c["delta"].get("content") for c in data.get("choices", [])):
                first = time.perf_counter()
            if data.get("usage"):
                tokens = data["usage"]["completion_tokens"]
    end = time.perf_counter()
    return RequestResult((first or end) - start, end - start, tokens)


async def stream_responses(
    client: httpx.AsyncClient, server: Server, prompt: str, max_tokens: int
) -> RequestResult:
    body = {
        "model": server.model,
        "input": prompt,
        "max_output_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    start = time.perf_counter()
    first = None
    tokens = 0
    async with client.stream("POST", server.base_url + "/v1/responses", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = json.loads(line[6:])
            if first is None and data["type"] == "response.output_text.delta":
                first = time.perf_counter()
            if data["type"] in ("response.completed", "response.incomplete"):
                tokens = data["response"]["usage"]["output_tokens"]
    end = time.perf_counter()
    return RequestResult((first or end) - start, end - start, tokens)


@dataclass
class LevelResult:
    server: str
    api: str
    concurrency: int
    requests: int
    ttft_p50: float
    ttft_p95: float
    per_stream_tps: float
    aggregate_tps: float
    errors: int = 0
    first_error: str = ""  # what the first failed request said, for the table's note
    extra: dict[str, Any] = field(default_factory=dict)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run_level(
    server: Server, api: str, concurrency: int, requests: int, max_tokens: int
) -> LevelResult:
    fn = stream_chat if api == "chat" else stream_responses
    sem = asyncio.Semaphore(concurrency)
    results: list[RequestResult] = []
    errors = 0
    first_error = ""
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def one(i: int) -> None:
            nonlocal errors, first_error
            async with sem:
                try:
                    results.append(await fn(client, server, PROMPTS[i % len(PROMPTS)], max_tokens))
                except httpx.HTTPError as exc:
                    errors += 1
                    first_error = first_error or f"{type(exc).__name__}: {exc}"

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(requests)))
        wall = time.perf_counter() - start
    ttfts = [r.ttft for r in results]
    per_stream = [
        (r.tokens - 1) / (r.duration - r.ttft)
        for r in results
        if r.tokens > 1 and r.duration > r.ttft
    ]
    return LevelResult(
        server.name,
        api,
        concurrency,
        requests,
        ttft_p50=percentile(ttfts, 0.5),
        ttft_p95=percentile(ttfts, 0.95),
        per_stream_tps=statistics.mean(per_stream) if per_stream else 0.0,
        aggregate_tps=sum(r.tokens for r in results) / wall,
        errors=errors,
        first_error=first_error,
    )


def in_process_ceiling(args: argparse.Namespace, max_tokens: int) -> float:
    """Single-stream greedy decode tokens/s of llama-cpp-python itself, no server, no HTTP.

    The low-level API, because `llama_cpp.Llama` cannot switch weight repacking off."""
    import llama_cpp
    from llama_cpp import _internals as internals

    mparams = llama_cpp.llama_model_default_params()
    mparams.use_extra_bufts = args.repack
    model = internals.LlamaModel(path_model=str(args.model), params=mparams, verbose=False)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = args.ctx_size
    cparams.n_threads = cparams.n_threads_batch = args.threads
    ctx = internals.LlamaContext(model=model, params=cparams, verbose=False)
    sampler = llama_cpp.llama_sampler_init_greedy()
    eos = model.token_eos()
    best = 0.0
    for prompt in PROMPTS[:3]:
        text = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
        tokens = model.tokenize(text.encode(), add_bos=False, special=True)
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx.ctx), True)
        batch = (llama_cpp.llama_token * len(tokens))(*tokens)
        llama_cpp.llama_decode(ctx.ctx, llama_cpp.llama_batch_get_one(batch, len(tokens)))
        first = time.perf_counter()  # prefill done: time decode only
        n = 0
        while n < max_tokens:
            tok = llama_cpp.llama_sampler_sample(sampler, ctx.ctx, -1)
            if tok == eos:
                break
            one = (llama_cpp.llama_token * 1)(tok)
            llama_cpp.llama_decode(ctx.ctx, llama_cpp.llama_batch_get_one(one, 1))
            n += 1
        if n > 0:
            best = max(best, n / (time.perf_counter() - first))
    llama_cpp.llama_sampler_free(sampler)
    ctx.close()
    model.close()
    return best


async def prefix_cache_case(server: Server, slots: int) -> dict[str, Any]:
    """TTFT of turn 3 of a previous_response_id chain vs the same prompt sent cold."""
    doc = " ".join(
        f"Fact {i}: the {i}th lantern in the old harbour is painted blue." for i in range(80)
    )
    turns = [
        "Summarise the facts in one line.",
        "Which lantern is the tenth?",
        "Is lantern 42 blue?",
    ]
    async with httpx.AsyncClient(timeout=600) as client:

        async def create(body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
            body = {
                "model": server.model,
                "max_output_tokens": 16,
                "temperature": 0,
                "stream": True,
                **body,
            }
            start = time.perf_counter()
            first = None
            final: dict[str, Any] = {}
            async with client.stream("POST", server.base_url + "/v1/responses", json=body) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        data = json.loads(line[6:])
                        if first is None and data["type"] == "response.output_text.delta":
                            first = time.perf_counter()
                        if "response" in data:
                            final = data["response"]
            return (first or time.perf_counter()) - start, final

        _, r1 = await create({"input": f"{doc}\n\n{turns[0]}"})
        _, r2 = await create({"input": turns[1], "previous_response_id": r1["id"]})
        warm_ttft, r3 = await create({"input": turns[2], "previous_response_id": r2["id"]})
        history = [
            {"role": "user", "content": f"{doc}\n\n{turns[0]}"},
            {"role": "assistant", "content": r1["output"][0]["content"][0]["text"]},
            {"role": "user", "content": turns[1]},
            {"role": "assistant", "content": r2["output"][0]["content"][0]["text"]},
            {"role": "user", "content": turns[2]},
        ]
        # Evict every slot's cache: one unrelated long prompt per slot, all at once.
        filler = " ".join(f"Unrelated sentence number {i} about gardens." for i in range(120))
        await asyncio.gather(
            *(create({"input": f"{k} {filler}", "max_output_tokens": 1}) for k in range(slots))
        )
        cold_ttft, cold = await create({"input": history})
    usage = r3["usage"]
    return {
        "history_tokens": usage["input_tokens"],
        "warm_cached_tokens": usage["input_tokens_details"]["cached_tokens"],
        "cached_fraction": usage["input_tokens_details"]["cached_tokens"] / usage["input_tokens"],
        "cold_input_tokens": cold["usage"]["input_tokens"],
        "cold_cached_tokens": cold["usage"]["input_tokens_details"]["cached_tokens"],
        "warm_ttft": warm_ttft,
        "cold_ttft": cold_ttft,
        "warm_over_cold": warm_ttft / cold_ttft,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--llama-server", type=Path, required=True, help="llama-server binary")
    p.add_argument("--model", type=Path, default=None, help="GGUF (default: embedded model)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--ctx-size", type=int, default=2048, help="per-sequence context")
    p.add_argument("--parallel", type=int, default=16, help="slots on both servers")
    p.add_argument("--levels", default="1,4,8,16", help="concurrency levels")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument(
        "--repack",
        choices=("auto", "on", "off"),
        default="auto",
        help="weight repacking on both servers and the ceiling (auto: off on AMX CPUs)",
    )
    p.add_argument(
        "--rounds", type=int, default=2, help="requests per level = rounds x level (min 4)"
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "latest.json")
    args = p.parse_args()
    args.model = args.model or Settings().model_path()
    args.repack = (not cpu_advertises_amx()) if args.repack == "auto" else args.repack == "on"
    levels = [int(x) for x in args.levels.split(",")]
    log_dir = args.out.parent
    log_dir.mkdir(parents=True, exist_ok=True)

    rows: list[LevelResult] = []
    rss: dict[str, float] = {}
    prefix: dict[str, Any] = {}

    def measure(server: Server, apis: list[str]) -> None:
        asyncio.run(run_level(server, "chat", 2, 2, 8))  # warm-up
        for level in levels:
            for api in apis:
                n = max(4, args.rounds * level)
                rows.append(asyncio.run(run_level(server, api, level, n, args.max_tokens)))
                r = rows[-1]
                print(
                    f"  {r.server:12} {r.api:9} c={level:<3} agg {r.aggregate_tps:7.1f} tok/s",
                    flush=True,
                )

    llama = start_llama_server(args, log_dir)
    try:
        measure(llama, ["chat"])
        rss[llama.name] = llama.peak_rss_mib()
        # respd as the stateful layer in front of the same llama-server.
        front = start_respd_upstream(args, log_dir, llama)
        try:
            measure(front, ["chat", "responses"])
        finally:
            front.stop()
    finally:
        llama.stop()
    respd = start_respd(args, log_dir)
    try:
        measure(respd, ["chat", "responses"])
        prefix = asyncio.run(prefix_cache_case(respd, args.parallel))
        rss[respd.name] = respd.peak_rss_mib()
    finally:
        respd.stop()
    ceiling = in_process_ceiling(args, args.max_tokens)

    def find(name: str, api: str, level: int) -> LevelResult:
        return next(r for r in rows if r.server == name and r.api == api and r.concurrency == level)

    print()
    print(
        f"model {args.model.name}, threads {args.threads}, ctx {args.ctx_size}/seq, "
        f"{args.parallel} slots, {args.max_tokens} tokens/request"
    )
    head = (
        f"{'conc':>4} {'server/api':<19} {'TTFT p50':>9} {'TTFT p95':>9} "
        f"{'tok/s/stream':>12} {'agg tok/s':>10} {'vs llama-server':>16}"
    )
    print(head)
    print("-" * len(head))
    summary: dict[str, Any] = {"ratios": {}}
    for level in levels:
        base = find("llama-server", "chat", level)
        for name, api in (
            ("llama-server", "chat"),
            ("respd", "chat"),
            ("respd", "responses"),
            ("respd→llama", "chat"),
            ("respd→llama", "responses"),
        ):
            r = find(name, api, level)
            ratio = r.aggregate_tps / base.aggregate_tps if base.aggregate_tps else float("nan")
            r.extra["ratio_vs_llama_server"] = ratio
            summary["ratios"][f"{name}/{api}@{level}"] = ratio
            print(
                f"{level:>4} {name + '/' + api:<19} {r.ttft_p50 * 1000:8.0f}ms "
                f"{r.ttft_p95 * 1000:8.0f}ms {r.per_stream_tps:12.1f} {r.aggregate_tps:10.1f} "
                f"{ratio:15.2f}x"
                + (f"  ({r.errors} errors; first: {r.first_error})" if r.errors else "")
            )
    single = find("respd", "chat", 1).per_stream_tps
    print()
    print(
        f"in-process ceiling (llama-cpp-python decode, no server): {ceiling:.1f} tok/s; "
        f"respd single stream {single:.1f} tok/s = {single / ceiling:.2f}x"
    )
    if 8 in levels:
        agg8 = find("respd", "chat", 8).aggregate_tps
        print(f"respd aggregate at 8 streams / its single stream: {agg8 / single:.2f}x")
        summary["respd_agg8_over_single"] = agg8 / single
    print("peak RSS: " + ", ".join(f"{k} {v:.0f} MiB" for k, v in rss.items()))
    if prefix:
        print(
            f"prefix cache: turn-3 TTFT {prefix['warm_ttft'] * 1000:.0f}ms warm vs "
            f"{prefix['cold_ttft'] * 1000:.0f}ms cold = {prefix['warm_over_cold']:.2f}x; "
            f"cached {prefix['warm_cached_tokens']}/{prefix['history_tokens']} tokens "
            f"({prefix['cached_fraction']:.0%})"
        )
    summary.update(
        {
            "ceiling_tps": ceiling,
            "respd_single_over_ceiling": single / ceiling,
            "peak_rss_mib": rss,
            "prefix_cache": prefix,
            "rows": [asdict(r) for r in rows],
            "args": {k: str(v) for k, v in vars(args).items()},
        }
    )
    args.out.write_text(json.dumps(summary, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
