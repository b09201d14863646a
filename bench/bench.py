"""Side-by-side throughput benchmark: respd vs llama.cpp's llama-server, same GGUF, same run.

Both servers get the same model, threads, context and parallel slots. The same prompts are
streamed through each at every concurrency level (chat completions on both, the Responses
API on respd too), and the table reports ratios, which hold up on a noisy machine far
better than absolute numbers; the throughput levels send `ignore_eos` so every request
decodes exactly max_tokens on both servers. It also measures the in-process ceiling
(llama-cpp-python decoding with no server), a prefix-cache case (a 3-turn
previous_response_id chain), an agent-chain case (many interleaved multi-turn conversations
over few slots, so a conversation's slot is reused by others between its turns) and an edit
case ("rewrite this file with one change": decode speed with and without n-gram
speculation on each server). `--only` reruns some of these cases.

Build llama-server from the llama.cpp sources vendored in the llama-cpp-python sdist of
the installed version (see bench/README.md), then:

    python bench/bench.py --llama-server /path/to/llama-server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from respd.config import embedded_model_path  # noqa: E402
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

CASES = ("levels", "prefix", "agent", "edit", "ceiling")
# What a case survives (a server that exits or hangs at start, a dropped connection): it
# is recorded and the run goes on, so one broken part does not lose the others' numbers.


class StreamError(Exception):
    """A streamed request that failed: a connection error or a non-2xx status."""


CASE_ERRORS = (RuntimeError, OSError, httpx.HTTPError, subprocess.SubprocessError, StreamError)
# Sent on every throughput-level request: both servers decode exactly max_tokens, so their
# token rates compare like with like whatever the model would have stopped at.
LEVEL_EXTRA: dict[str, Any] = {"ignore_eos": True}

AGENT_TURNS = [
    "Summarise the context in one sentence.",
    "Which crate holds the most items?",
    "List the ports mentioned so far.",
    "Rewrite your last answer more formally.",
    "Name one risk for this project.",
    "Give the project a short title.",
]


def agent_doc(conv: int) -> str:
    """A ~400-token context document, unique from its first words, for one conversation."""
    rng = random.Random(conv)
    colours = ["red", "blue", "green", "grey", "amber", "white", "black", "violet"]
    goods = ["lamps", "ropes", "barrels", "maps", "nails", "sails", "tiles", "clocks"]
    ports = ["Avonmouth", "Brest", "Cadiz", "Dunkirk", "Esbjerg", "Faro", "Genoa", "Hull"]
    lines = [f"Context for project {conv} ({rng.choice(ports)} office)."]
    for j in range(14):
        lines.append(
            f"Note {j}: the {rng.choice(colours)} crate {conv}-{j} holds {rng.randint(2, 900)} "
            f"{rng.choice(goods)} and ships from {rng.choice(ports)} on day {rng.randint(1, 28)}."
        )
    return " ".join(lines)


# (module, record class, three numeric fields): one generated ~60-line file each.
EDIT_MODULES = [
    ("inventory", "Item", ("price", "weight", "stock")),
    ("geometry", "Box", ("width", "height", "depth")),
    ("library", "Book", ("pages", "year", "copies")),
]


def edit_file(module: str, cls: str, fields: tuple[str, str, str]) -> str:
    """A plain Python module of about 60 lines, deterministic from its arguments."""
    out = [
        f'"""Helpers for {module} records."""',
        "",
        "from __future__ import annotations",
        "",
        "from dataclasses import dataclass",
        "",
        "",
        "@dataclass",
        f"class {cls}:",
        "    name: str",
        *(f"    {f}: float" for f in fields),
        "",
        "",
        f"def load_{module}(rows: list[list[str]]) -> list[{cls}]:",
        "    result = []",
        "    for row in rows:",
        f"        result.append({cls}(row[0], float(row[1]), float(row[2]), float(row[3])))",
        "    return result",
    ]
    for f in fields:
        out += [
            "",
            "",
            f"def total_{f}(records: list[{cls}]) -> float:",
            f'    """Sum of the {f} of every record."""',
            "    total = 0.0",
            "    for record in records:",
            f"        total += record.{f}",
            "    return total",
        ]
    out += [
        "",
        "",
        f"def largest_{fields[1]}(records: list[{cls}]) -> {cls} | None:",
        "    best = None",
        "    for record in records:",
        f"        if best is None or record.{fields[1]} > best.{fields[1]}:",
        "            best = record",
        "    return best",
        "",
        "",
        "def main() -> None:",
        '    rows = [["a", "1", "2", "3"], ["b", "4", "5", "6"]]',
        f"    records = load_{module}(rows)",
        f"    print(total_{fields[0]}(records), largest_{fields[1]}(records))",
        "",
        "",
        'if __name__ == "__main__":',
        "    main()",
    ]
    return "\n".join(out) + "\n"


def edit_prompts() -> list[tuple[str, str, str]]:
    """(prompt, old name, new name): rename a function that is also called from main()."""
    prompts = []
    for module, cls, fields in EDIT_MODULES:
        old, new = f"total_{fields[0]}", f"sum_of_{fields[0]}"
        prompts.append(
            (
                f"Rewrite the following file in full, renaming function {old} to {new}. "
                f"Output only the code.\n\n{edit_file(module, cls, fields)}",
                old,
                new,
            )
        )
    return prompts


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
    cmd: list[str] = field(default_factory=list)

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


def log_name(server_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "-", server_name).strip("-")


def help_text(cmd: list[str]) -> str:
    """A server's --help, to pass only the flags this build has."""
    done = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


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
    server.stop()  # a hung start must not keep the CPUs from the cases after it
    raise RuntimeError(f"{server.name} did not become healthy")


def start_respd(
    args: argparse.Namespace,
    log_dir: Path,
    *,
    parallel: int | None = None,
    extra: list[str] | None = None,
    name: str = "respd",
) -> Server:
    """respd on the GGUF; `extra` flags only where a case needs them (it exits on unknown ones)."""
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
        str(parallel or args.parallel),
        "--repack",
        "on" if args.repack else "off",
        "--poll",
        str(getattr(args, "poll", 100)),
        "--log-level",
        "warning",
        *(extra or []),
    ]
    log = (log_dir / f"{log_name(name)}.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    server = Server(name, proc, f"http://127.0.0.1:{port}", "bench", cmd)
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


def start_llama_server(
    args: argparse.Namespace,
    log_dir: Path,
    *,
    parallel: int | None = None,
    extra: list[str] | None = None,
    name: str = "llama-server",
) -> Server:
    port = free_port()
    parallel = parallel or args.parallel
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
        str(args.ctx_size * parallel),
        "-np",
        str(parallel),
        "-b",
        "512",
        "-ub",
        "512",
        "--alias",
        "bench",
        "--no-webui",
        "--repack" if args.repack else "--no-repack",
        *(extra or []),
    ]
    log = (log_dir / f"{log_name(name)}.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    server = Server(name, proc, f"http://127.0.0.1:{port}", "bench", cmd)
    wait_healthy(server)
    return server


@dataclass
class RequestResult:
    ttft: float
    duration: float
    tokens: int
    text: str = ""
    input_tokens: int = 0
    cached_tokens: int | None = None  # None: the server did not say
    response_id: str = ""


Prompt = str | list[dict[str, Any]]  # one user message, or the whole message list


# The first generated text of a stream: a chat delta with non-empty content, or a
# Responses text delta. Searched in raw bytes so that no event is parsed before the end.
FIRST_TEXT = {
    "chat": re.compile(rb'"content":\s*"[^"]'),
    "responses": re.compile(rb'"type":\s*"response\.output_text\.delta"'),
}


async def post_stream(
    server: Server, path: str, body: dict[str, Any], first_text: re.Pattern[bytes]
) -> tuple[float | None, float, list[dict[str, Any]]]:
    """POST `body` and read the event stream to its end on a connection of its own: the
    time the first generated text arrived (None if none did), the end time, and the
    events, parsed only after the end.

    Each token the client handles costs the two shared cores the decode threads need, and
    a full HTTP client parsing every event cost about half a millisecond a token here,
    more than respd's own event loop. This reader appends bytes and matches one pattern
    until the first text arrives, so the servers are measured with as little of the
    client in the way as the wire allows. `Connection: close`: llama-server drops idle
    keep-alive connections, which made pooled clients lose requests."""
    url = httpx.URL(server.base_url)
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
        "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        f"Connection: close\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode()
    try:
        reader, writer = await asyncio.open_connection(url.host, url.port)
    except OSError as exc:
        raise StreamError(f"{type(exc).__name__}: {exc}") from exc
    first: float | None = None
    chunks: list[bytes] = []
    try:
        writer.write(head + payload)
        tail = b""
        while data := await reader.read(65536):
            chunks.append(data)
            if first is None:
                if first_text.search(tail + data):
                    first = time.perf_counter()
                tail = data[-64:]
    except OSError as exc:
        raise StreamError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        writer.close()
    end = time.perf_counter()
    return first, end, parse_stream(b"".join(chunks))


def parse_stream(raw: bytes) -> list[dict[str, Any]]:
    """The `data:` events of an HTTP/1.1 response holding a server-sent event stream."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split()[1]) if status_line.startswith("HTTP/") else 0
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    if "chunked" in headers.get("transfer-encoding", ""):
        parts, at = [], 0
        while True:
            eol = body.find(b"\r\n", at)
            size = int(body[at:eol].split(b";")[0] or b"0", 16) if eol >= 0 else 0
            if size == 0:
                break
            parts.append(body[eol + 2 : eol + 2 + size])
            at = eol + 2 + size + 2
        body = b"".join(parts)
    if not 200 <= status < 300:
        raise StreamError(f"HTTP {status}: {body[:300].decode(errors='replace')}")
    events = []
    for line in body.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[6:]))
    return events


async def stream_chat(
    server: Server,
    prompt: Prompt,
    max_tokens: int,
    extra: dict[str, Any] | None = None,
) -> RequestResult:
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    body = {
        "model": server.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(extra or {}),
    }
    start = time.perf_counter()
    first, end, events = await post_stream(server, "/v1/chat/completions", body, FIRST_TEXT["chat"])
    result = RequestResult(0.0, 0.0, 0)
    parts: list[str] = []
    for data in events:
        for choice in data.get("choices", []):
            if content := choice["delta"].get("content"):
                parts.append(content)
        if usage := data.get("usage"):
            result.tokens = usage["completion_tokens"]
            result.input_tokens = usage.get("prompt_tokens", 0)
            details = usage.get("prompt_tokens_details") or {}
            if "cached_tokens" in details:
                result.cached_tokens = details["cached_tokens"]
        # llama-server reports its prompt-cache reuse in `timings`, not always in usage.
        timings = data.get("timings") or {}
        if result.cached_tokens is None and "cache_n" in timings:
            result.cached_tokens = timings["cache_n"]
    result.ttft, result.duration, result.text = (first or end) - start, end - start, "".join(parts)
    return result


async def stream_responses(
    server: Server,
    prompt: Prompt,
    max_tokens: int,
    extra: dict[str, Any] | None = None,
) -> RequestResult:
    body = {
        "model": server.model,
        "input": prompt,
        "max_output_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        **(extra or {}),
    }
    start = time.perf_counter()
    first, end, events = await post_stream(server, "/v1/responses", body, FIRST_TEXT["responses"])
    result = RequestResult(0.0, 0.0, 0)
    parts: list[str] = []
    for data in events:
        if data["type"] == "response.output_text.delta":
            parts.append(data["delta"])
        if data["type"] in ("response.completed", "response.incomplete"):
            usage = data["response"]["usage"]
            result.tokens = usage["output_tokens"]
            result.input_tokens = usage["input_tokens"]
            result.cached_tokens = usage["input_tokens_details"]["cached_tokens"]
            result.response_id = data["response"]["id"]
        if data["type"] in ("response.failed", "error"):
            raise StreamError(f"the stream failed: {json.dumps(data)[:300]}")
    result.ttft, result.duration, result.text = (first or end) - start, end - start, "".join(parts)
    return result


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


async def run_requests(
    server: Server,
    api: str,
    concurrency: int,
    prompts: list[Prompt],
    max_tokens: int,
    extra: dict[str, Any] | None = None,
) -> tuple[list[RequestResult | None], float, list[str]]:
    """Stream every prompt, `concurrency` at a time: results in prompt order (None where
    the request failed), wall time, and what each failure said."""
    fn = stream_chat if api == "chat" else stream_responses
    sem = asyncio.Semaphore(concurrency)
    results: list[RequestResult | None] = [None] * len(prompts)
    errors: list[str] = []

    async def one(i: int) -> None:
        async with sem:
            try:
                results[i] = await fn(server, prompts[i], max_tokens, extra)
            except StreamError as exc:
                errors.append(str(exc))

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(len(prompts))))
    wall = time.perf_counter() - start
    return results, wall, errors


def decode_tps(r: RequestResult) -> float | None:
    """Tokens/s after the first token arrived (None when there is no decode time to measure)."""
    if r.tokens > 1 and r.duration > r.ttft:
        return (r.tokens - 1) / (r.duration - r.ttft)
    return None


def summarise_level(
    name: str,
    api: str,
    concurrency: int,
    results: list[RequestResult | None],
    wall: float,
    errors: list[str],
) -> LevelResult:
    done = [r for r in results if r is not None]
    ttfts = [r.ttft for r in done]
    per_stream = [t for r in done if (t := decode_tps(r)) is not None]
    return LevelResult(
        name,
        api,
        concurrency,
        len(results),
        ttft_p50=percentile(ttfts, 0.5) if ttfts else float("nan"),
        ttft_p95=percentile(ttfts, 0.95) if ttfts else float("nan"),
        per_stream_tps=statistics.mean(per_stream) if per_stream else 0.0,
        aggregate_tps=sum(r.tokens for r in done) / wall,
        errors=len(errors),
        first_error=errors[0] if errors else "",
    )


async def run_level(
    server: Server, api: str, concurrency: int, requests: int, max_tokens: int
) -> LevelResult:
    prompts: list[Prompt] = [PROMPTS[i % len(PROMPTS)] for i in range(requests)]
    results, wall, errors = await run_requests(
        server, api, concurrency, prompts, max_tokens, LEVEL_EXTRA
    )
    level = summarise_level(server.name, api, concurrency, results, wall, errors)
    # ignore_eos makes every request exactly max_tokens long; count any that were not.
    level.extra["short_requests"] = sum(
        1 for r in results if r is not None and r.tokens != max_tokens
    )
    return level


def mean_level(a: LevelResult, b: LevelResult) -> LevelResult:
    """One server's two runs of a level as one row: the mean of each figure."""
    return LevelResult(
        a.server,
        a.api,
        a.concurrency,
        a.requests + b.requests,
        ttft_p50=(a.ttft_p50 + b.ttft_p50) / 2,
        ttft_p95=(a.ttft_p95 + b.ttft_p95) / 2,
        per_stream_tps=(a.per_stream_tps + b.per_stream_tps) / 2,
        aggregate_tps=(a.aggregate_tps + b.aggregate_tps) / 2,
        errors=a.errors + b.errors,
        first_error=a.first_error or b.first_error,
        extra={
            "short_requests": a.extra["short_requests"] + b.extra["short_requests"],
            "runs_aggregate_tps": [a.aggregate_tps, b.aggregate_tps],
        },
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

    async def create(body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        body = {
            "model": server.model,
            "max_output_tokens": 16,
            "temperature": 0,
            "stream": True,
            **body,
        }
        start = time.perf_counter()
        first, end, events = await post_stream(
            server, "/v1/responses", body, FIRST_TEXT["responses"]
        )
        final: dict[str, Any] = next(
            (e["response"] for e in reversed(events) if "response" in e), {}
        )
        return (first or end) - start, final

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
    # Evict every slot's cache: one unrelated long prompt per slot, all at once. The same
    # history then comes from the host-memory KV tier (when it has one); the history with
    # its first word changed shares nothing with any cache: a cold prefill.
    filler = " ".join(f"Unrelated sentence number {i} about gardens." for i in range(120))
    await asyncio.gather(
        *(create({"input": f"{k} {filler}", "max_output_tokens": 1}) for k in range(slots))
    )
    tier_ttft, tier = await create({"input": history})
    cold_history = [{**history[0], "content": "Notes. " + history[0]["content"]}, *history[1:]]
    cold_ttft, cold = await create({"input": cold_history})
    usage = r3["usage"]
    return {
        "history_tokens": usage["input_tokens"],
        "warm_cached_tokens": usage["input_tokens_details"]["cached_tokens"],
        "cached_fraction": usage["input_tokens_details"]["cached_tokens"] / usage["input_tokens"],
        "tier_cached_tokens": tier["usage"]["input_tokens_details"]["cached_tokens"],
        "cold_input_tokens": cold["usage"]["input_tokens"],
        "cold_cached_tokens": cold["usage"]["input_tokens_details"]["cached_tokens"],
        "warm_ttft": warm_ttft,
        "tier_ttft": tier_ttft,
        "cold_ttft": cold_ttft,
        "warm_over_cold": warm_ttft / cold_ttft,
    }


async def agent_chain(server: Server, api: str, args: argparse.Namespace) -> dict[str, Any]:
    """Many multi-turn conversations over few slots, interleaved: turn k of every
    conversation runs before turn k+1 of any, `agent_slots` at a time, so between two turns
    of one conversation its slot has served others. On respd each turn chains on
    previous_response_id (stored) with a per-conversation prompt_cache_key; on llama-server
    each turn resends the whole history with cache_prompt."""
    n, turns, max_tokens = args.agent_conversations, args.agent_turns, args.agent_max_tokens
    history: list[list[dict[str, Any]]] = [
        [{"role": "system", "content": agent_doc(i)}] for i in range(n)
    ]
    previous = [""] * n
    broken: set[int] = set()  # conversations whose chain failed: their later turns are skipped
    errors: list[str] = []
    by_turn: list[list[RequestResult]] = []
    sem = asyncio.Semaphore(args.agent_slots)

    async def one(i: int, k: int) -> RequestResult | None:
        user = {"role": "user", "content": AGENT_TURNS[k % len(AGENT_TURNS)]}
        async with sem:
            if i in broken:
                return None
            try:
                if api == "responses":
                    body: dict[str, Any] = {"store": True, "prompt_cache_key": f"conv-{i}"}
                    if k:
                        body["previous_response_id"] = previous[i]
                    prompt = user["content"] if k else [*history[i], user]
                    r = await stream_responses(server, prompt, max_tokens, body)
                    if not r.response_id:
                        raise RuntimeError("the response did not complete")
                    previous[i] = r.response_id
                else:
                    history[i].append(user)
                    extra = {"cache_prompt": True}
                    r = await stream_chat(server, history[i], max_tokens, extra)
                    history[i].append({"role": "assistant", "content": r.text})
                return r
            except (StreamError, RuntimeError) as exc:
                broken.add(i)
                errors.append(f"conversation {i} turn {k + 1}: {type(exc).__name__}: {exc}")
                return None

    start = time.perf_counter()
    for k in range(turns):
        done = await asyncio.gather(*(one(i, k) for i in range(n)))
        by_turn.append([r for r in done if r is not None])
    wall = time.perf_counter() - start
    later = [r for results in by_turn[1:] for r in results]
    ttfts = [r.ttft for r in later]
    out: dict[str, Any] = {
        "server": server.name,
        "api": api,
        "flags": server.cmd[server.cmd.index("serve") + 1 :]
        if api == "responses"
        else server.cmd[1:],
        "wall_s": wall,
        "turn1_ttft_p50": percentile([r.ttft for r in by_turn[0]], 0.5) if by_turn[0] else None,
        "ttft_p50": percentile(ttfts, 0.5) if ttfts else None,
        "ttft_p95": percentile(ttfts, 0.95) if ttfts else None,
        "ttft_p50_by_turn": [
            percentile([r.ttft for r in results], 0.5) if results else None for results in by_turn
        ],
        "last_turn_input_tokens_mean": (
            statistics.mean(r.input_tokens for r in by_turn[-1]) if by_turn[-1] else None
        ),
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
    }
    known = [r for r in later if r.cached_tokens is not None]
    inputs = sum(r.input_tokens for r in known)
    # Turns 2..N: the share of each prompt served from the KV cache rather than recomputed.
    out["cached_fraction"] = (
        sum(r.cached_tokens or 0 for r in known) / inputs if known and inputs else None
    )
    return out


# The agent case's llama-server row without its host-memory prompt cache.
NO_RAM_CACHE = "llama-server --cache-ram 0"


def run_agent_case(
    args: argparse.Namespace, log_dir: Path, rss: dict[str, float]
) -> dict[str, Any]:
    """The agent chain on fresh instances of both servers with `agent_slots` slots each;
    respd on its defaults (its host-memory KV tier included), llama-server with cache reuse
    on its defaults, and once more without its host-memory prompt cache (`--cache-ram 0`),
    where it has one: what a server that keeps only its slots' caches does."""
    llama_help = help_text([str(args.llama_server)])
    llama_extra = ["--cache-reuse", "256"] if "--cache-reuse" in llama_help else []
    out: dict[str, Any] = {
        "conversations": args.agent_conversations,
        "turns": args.agent_turns,
        "slots": args.agent_slots,
        "concurrency": args.agent_slots,
        "max_tokens": args.agent_max_tokens,
    }

    def llama(extra: list[str], name: str) -> Callable[[], Server]:
        return partial(
            start_llama_server, args, log_dir, parallel=args.agent_slots, extra=extra, name=name
        )

    starts: list[tuple[str, str, Callable[[], Server]]] = [
        ("llama-server", "chat", llama(llama_extra, "llama-server agent")),
        (
            "respd",
            "responses",
            partial(start_respd, args, log_dir, parallel=args.agent_slots, name="respd agent"),
        ),
    ]
    if "--cache-ram" in llama_help:
        no_cache = llama([*llama_extra, "--cache-ram", "0"], "llama-server agent cache-ram 0")
        starts.append((NO_RAM_CACHE, "chat", no_cache))
    for key, api, start in starts:
        try:
            server = start()
        except CASE_ERRORS as exc:
            out[key] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"  agent chain {key}: {out[key]['error']}", flush=True)
            continue
        try:
            asyncio.run(run_level(server, "chat", 2, 2, 8))  # warm-up
            out[key] = asyncio.run(agent_chain(server, api, args))
            rss[server.name] = server.peak_rss_mib()
        finally:
            server.stop()
        print(f"  agent chain {key}: flags {' '.join(out[key]['flags'])}", flush=True)
    return out


async def edit_level(
    server: Server, label: str, level: int, args: argparse.Namespace
) -> tuple[LevelResult, list[str | None]]:
    """One concurrency level of the edit case: each prompt at least once, greedy, stopping
    at EOS; returns the level and the text each prompt got on its first run."""
    prompts = edit_prompts()[: args.edit_prompts]
    n = max(level, len(prompts)) * args.edit_rounds
    chosen = [prompts[i % len(prompts)] for i in range(n)]
    results, wall, errors = await run_requests(
        server, "chat", level, [c[0] for c in chosen], args.edit_max_tokens
    )
    row = summarise_level(label, "chat", level, results, wall, errors)
    done = [(r, old, new) for r, (_, old, new) in zip(results, chosen, strict=True) if r]
    if done:
        # The edit was made: the new name is there and the old one is neither defined nor called.
        row.extra["renamed"] = sum(
            1 for r, old, new in done if new in r.text and f"{old}(" not in r.text
        ) / len(done)
        row.extra["completion_tokens_mean"] = statistics.mean(r.tokens for r, _, _ in done)
    return row, [r.text if r else None for r in results[: len(prompts)]]


def run_edit_case(args: argparse.Namespace, log_dir: Path, rss: dict[str, float]) -> dict[str, Any]:
    """Decode speed of "rewrite this file with one change" with and without n-gram
    speculation, on both servers, each configuration on a fresh instance."""
    levels = [int(x) for x in args.edit_levels.split(",")]
    slots = max(levels)
    has_speculation = "--speculation" in help_text([sys.executable, "-m", "respd", "serve"])
    spec_line = re.search(r"--spec-type\s+(\S+)", help_text([str(args.llama_server)]))
    llama_types = set(spec_line.group(1).split(",")) if spec_line else set()
    configs: list[tuple[str, Callable[[], Server]]] = []
    unavailable: dict[str, str] = {}

    def add(label: str, starter: Callable[..., Server], extra: list[str]) -> None:
        configs.append(
            (label, partial(starter, args, log_dir, parallel=slots, extra=extra, name=label))
        )

    add("respd spec=off", start_respd, ["--speculation", "off"] if has_speculation else [])
    if has_speculation:
        add("respd spec=ngram", start_respd, ["--speculation", "ngram"])
    else:
        unavailable["respd spec=ngram"] = "this respd has no --speculation flag"
    add("llama-server spec=none", start_llama_server, [])
    for kind in args.llama_spec_types.split(","):
        if kind in llama_types:
            add(f"llama-server spec={kind}", start_llama_server, ["--spec-type", kind])
        else:
            unavailable[f"llama-server spec={kind}"] = "no such --spec-type in this llama-server"
    rows: list[LevelResult] = []
    texts: dict[tuple[str, int], list[str | None]] = {}
    flags: dict[str, list[str]] = {}
    for label, start in configs:
        try:
            server = start()
        except CASE_ERRORS as exc:
            unavailable[label] = f"did not start: {type(exc).__name__}: {exc}"
            continue
        try:
            asyncio.run(run_level(server, "chat", 2, 2, 8))  # warm-up
            for level in levels:
                row, texts[(label, level)] = asyncio.run(edit_level(server, label, level, args))
                rows.append(row)
                print(
                    f"  edit {label:30} c={level:<2} {row.per_stream_tps:7.1f} tok/s/stream",
                    flush=True,
                )
            rss[label] = server.peak_rss_mib()
            flags[label] = server.cmd
        finally:
            server.stop()
    # Greedy speculation must not change the text: compare each speculative configuration's
    # single-stream output with its own server's non-speculative one.
    for row in rows:
        base = "respd spec=off" if row.server.startswith("respd") else "llama-server spec=none"
        if row.concurrency == 1 and row.server != base and (base, 1) in texts:
            pairs = list(zip(texts[(row.server, 1)], texts[(base, 1)], strict=True))
            row.extra["same_text_as_no_spec"] = sum(1 for a, b in pairs if a == b) / len(pairs)
    ratios: dict[str, Any] = {}
    for level in levels:
        at = {r.server: r for r in rows if r.concurrency == level}
        spec_row, off_row = at.get("respd spec=ngram"), at.get("respd spec=off")
        llamas = [r for name, r in at.items() if name.startswith("llama-server")]
        if not spec_row:
            continue
        for metric in ("per_stream_tps", "aggregate_tps"):
            if off_row and getattr(off_row, metric):
                ratios[f"respd-spec/respd-nospec {metric}@{level}"] = getattr(
                    spec_row, metric
                ) / getattr(off_row, metric)
            if llamas:
                best = max(llamas, key=lambda r: float(getattr(r, metric)))
                if getattr(best, metric):
                    ratios[f"respd-spec/best-llama-server {metric}@{level}"] = getattr(
                        spec_row, metric
                    ) / getattr(best, metric)
                    ratios[f"best-llama-server {metric}@{level}"] = best.server
    return {
        "prompts": args.edit_prompts,
        "max_tokens": args.edit_max_tokens,
        "levels": levels,
        "slots": slots,
        "rows": [asdict(r) for r in rows],
        "ratios": ratios,
        "not_available": unavailable,
        "flags": flags,
    }


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}ms"


def print_agent(agent: dict[str, Any]) -> None:
    print()
    print(
        f"agent chain: {agent['conversations']} conversations x {agent['turns']} turns, "
        f"{agent['slots']} slots, concurrency {agent['concurrency']}, "
        f"{agent['max_tokens']} tokens/turn; TTFT over turns 2..{agent['turns']}"
    )
    head = (
        f"{'server/api':<31} {'TTFT p50':>9} {'TTFT p95':>9} {'turn-1 p50':>10} "
        f"{'wall':>8} {'cached':>7}"
    )
    print(head)
    print("-" * len(head))
    for key in ("llama-server", NO_RAM_CACHE, "respd"):
        r = agent.get(key)
        if not r:
            continue
        if "error" in r:
            print(f"{key:<31} failed: {r['error']}")
            continue
        cached = "-" if r["cached_fraction"] is None else f"{r['cached_fraction']:.0%}"
        print(
            f"{key + '/' + r['api']:<31} {ms(r['ttft_p50']):>9} {ms(r['ttft_p95']):>9} "
            f"{ms(r['turn1_ttft_p50']):>10} {r['wall_s']:7.1f}s {cached:>7}"
            + (f"  ({r['errors']} errors; first: {r['first_error']})" if r["errors"] else "")
        )
    if "respd" in agent and "llama-server" in agent:
        a, b = agent["respd"], agent["llama-server"]
        if a.get("ttft_p50") and b.get("ttft_p50"):
            agent["respd_over_llama_ttft_p50"] = a["ttft_p50"] / b["ttft_p50"]
            agent["respd_over_llama_wall"] = a["wall_s"] / b["wall_s"]
            print(
                f"respd / llama-server: TTFT p50 {agent['respd_over_llama_ttft_p50']:.2f}x, "
                f"wall {agent['respd_over_llama_wall']:.2f}x"
            )
    if "respd" in agent and NO_RAM_CACHE in agent:
        a, b = agent["respd"], agent[NO_RAM_CACHE]
        if a.get("ttft_p50") and b.get("ttft_p50"):
            agent["respd_over_llama_no_ram_cache_ttft_p50"] = a["ttft_p50"] / b["ttft_p50"]
            print(
                f"respd / llama-server without its RAM prompt cache: TTFT p50 "
                f"{agent['respd_over_llama_no_ram_cache_ttft_p50']:.2f}x"
            )
    for key in ("respd", "llama-server"):
        if "flags" in agent.get(key, {}):
            print(f"{key} flags: {' '.join(agent[key]['flags'])}")


def print_edit(edit: dict[str, Any]) -> None:
    print()
    print(
        f"edit: rewrite a ~60-line file renaming one function, {edit['prompts']} files, "
        f"max {edit['max_tokens']} tokens, temperature 0, {edit['slots']} slots"
    )
    head = (
        f"{'conc':>4} {'config':<30} {'TTFT p50':>9} {'tok/s/stream':>12} {'agg tok/s':>10} "
        f"{'tokens':>7} {'renamed':>8} {'same text':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in sorted(edit["rows"], key=lambda r: r["concurrency"]):
        x = r["extra"]
        same = x.get("same_text_as_no_spec")
        print(
            f"{r['concurrency']:>4} {r['server']:<30} {ms(r['ttft_p50']):>9} "
            f"{r['per_stream_tps']:12.1f} {r['aggregate_tps']:10.1f} "
            f"{x.get('completion_tokens_mean', 0):7.0f} {x.get('renamed', 0):8.0%} "
            f"{'-' if same is None else f'{same:.0%}':>9}"
            + (f"  ({r['errors']} errors; first: {r['first_error']})" if r["errors"] else "")
        )
    for key, value in edit["ratios"].items():
        print(f"{key}: {value if isinstance(value, str) else f'{value:.2f}x'}")
    for label, why in edit["not_available"].items():
        print(f"{label}: not available ({why})")


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
        "--poll",
        type=int,
        default=100,
        help="respd --poll: 100 (default) is the spinning wait llama-server's OpenMP threads "
        "use, so both wait alike; respd's own default, 0, sleeps for hosts shared with other "
        "work and costs a 2-thread single stream about a third here",
    )
    p.add_argument(
        "--repack",
        choices=("auto", "on", "off"),
        default="auto",
        help="weight repacking on both servers and the ceiling (auto: off on AMX CPUs)",
    )
    p.add_argument(
        "--rounds", type=int, default=2, help="requests per level = rounds x level (min 4)"
    )
    p.add_argument(
        "--only", default=",".join(CASES), help=f"comma list of cases to run, of {','.join(CASES)}"
    )
    g = p.add_argument_group("agent chain")
    g.add_argument("--agent-conversations", type=int, default=16)
    g.add_argument("--agent-turns", type=int, default=6)
    g.add_argument(
        "--agent-slots", type=int, default=4, help="slots on both servers and client concurrency"
    )
    g.add_argument("--agent-max-tokens", type=int, default=24, help="output tokens per turn")
    g = p.add_argument_group("edit")
    g.add_argument("--edit-prompts", type=int, default=3, choices=(1, 2, 3), help="files used")
    g.add_argument("--edit-max-tokens", type=int, default=600)
    g.add_argument("--edit-levels", default="1,4", help="concurrency levels (slots: the largest)")
    g.add_argument(
        "--edit-rounds", type=int, default=1, help="requests per level = rounds x max(level, files)"
    )
    g.add_argument(
        "--llama-spec-types",
        default="ngram-simple,ngram-mod",
        help="llama-server --spec-type values to measure (best one is the comparison)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "latest.json")
    args = p.parse_args()
    only = set(args.only.split(","))
    if only - set(CASES):
        p.error(f"--only: unknown case(s) {','.join(sorted(only - set(CASES)))}")
    args.model = args.model or embedded_model_path()
    args.repack = (not cpu_advertises_amx()) if args.repack == "auto" else args.repack == "on"
    levels = [int(x) for x in args.levels.split(",")]
    log_dir = args.out.parent
    log_dir.mkdir(parents=True, exist_ok=True)

    rows: list[LevelResult] = []
    rss: dict[str, float] = {}
    prefix: dict[str, Any] = {}
    agent: dict[str, Any] = {}
    edit: dict[str, Any] = {}
    ceiling: float | None = None

    def measure(servers: list[tuple[Server, str]]) -> None:
        """Every level on every (server, api) in turn, llama-server first and again last:
        its row is the mean of the two, so drift in the machine's speed during a level
        lands on both sides of each ratio."""
        for server in {server.name: server for server, _ in servers}.values():
            asyncio.run(run_level(server, "chat", 2, 2, 8))  # warm-up
        for level in levels:
            n = max(4, args.rounds * level)
            got = []
            for server, api in servers:
                got.append(asyncio.run(run_level(server, api, level, n, args.max_tokens)))
                r = got[-1]
                print(
                    f"  {r.server:12} {r.api:9} c={level:<3} agg {r.aggregate_tps:7.1f} tok/s",
                    flush=True,
                )
            rows.append(mean_level(got[0], got[-1]))
            rows.extend(got[1:-1])

    def guarded(case: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        # One failing case (a server that will not start) must not lose the others' numbers.
        try:
            return fn()
        except CASE_ERRORS as exc:
            print(f"  {case} failed: {type(exc).__name__}: {exc}", flush=True)
            return {"error": f"{type(exc).__name__}: {exc}"}

    if only & {"levels", "prefix"}:
        respd = start_respd(args, log_dir)
        try:
            if "levels" in only:
                llama = start_llama_server(args, log_dir)
                try:
                    # respd as the stateful layer in front of the same llama-server.
                    front = start_respd_upstream(args, log_dir, llama)
                    try:
                        measure(
                            [
                                (llama, "chat"),
                                (respd, "chat"),
                                (respd, "responses"),
                                (front, "chat"),
                                (front, "responses"),
                                (llama, "chat"),
                            ]
                        )
                    finally:
                        front.stop()
                    rss[llama.name] = llama.peak_rss_mib()
                finally:
                    llama.stop()
            if "prefix" in only:
                prefix = asyncio.run(prefix_cache_case(respd, args.parallel))
            rss[respd.name] = respd.peak_rss_mib()
        finally:
            respd.stop()
    if "agent" in only:
        agent = guarded("agent", lambda: run_agent_case(args, log_dir, rss))
    if "edit" in only:
        edit = guarded("edit", lambda: run_edit_case(args, log_dir, rss))
    if "ceiling" in only:
        ceiling = in_process_ceiling(args, args.max_tokens)

    def find(name: str, api: str, level: int) -> LevelResult:
        return next(r for r in rows if r.server == name and r.api == api and r.concurrency == level)

    print()
    print(
        f"model {args.model.name}, threads {args.threads}, ctx {args.ctx_size}/seq, "
        f"{args.parallel} slots, {args.max_tokens} tokens/request (ignore_eos)"
    )
    summary: dict[str, Any] = {"ratios": {}}
    if rows:
        head = (
            f"{'conc':>4} {'server/api':<19} {'TTFT p50':>9} {'TTFT p95':>9} "
            f"{'tok/s/stream':>12} {'agg tok/s':>10} {'vs llama-server':>16}"
        )
        print(head)
        print("-" * len(head))
    for level in levels if rows else []:
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
            notes = []
            if r.errors:
                notes.append(f"{r.errors} errors; first: {r.first_error}")
            if r.extra["short_requests"]:
                notes.append(f"{r.extra['short_requests']} requests not {args.max_tokens} tokens")
            print(
                f"{level:>4} {name + '/' + api:<19} {r.ttft_p50 * 1000:8.0f}ms "
                f"{r.ttft_p95 * 1000:8.0f}ms {r.per_stream_tps:12.1f} {r.aggregate_tps:10.1f} "
                f"{ratio:15.2f}x" + (f"  ({'; '.join(notes)})" if notes else "")
            )
    single = find("respd", "chat", 1).per_stream_tps if rows and 1 in levels else None
    if ceiling is not None:
        print()
        print(
            f"in-process ceiling (llama-cpp-python decode, no server): {ceiling:.1f} tok/s"
            + (
                f"; respd single stream {single:.1f} tok/s = {single / ceiling:.2f}x"
                if single
                else ""
            )
        )
        if single:
            summary["respd_single_over_ceiling"] = single / ceiling
    if single and 8 in levels:
        agg8 = find("respd", "chat", 8).aggregate_tps
        print(f"respd aggregate at 8 streams / its single stream: {agg8 / single:.2f}x")
        summary["respd_agg8_over_single"] = agg8 / single
    print("peak RSS: " + ", ".join(f"{k} {v:.0f} MiB" for k, v in rss.items()))
    if prefix:
        print(
            f"prefix cache: turn-3 TTFT {prefix['warm_ttft'] * 1000:.0f}ms chained vs "
            f"{prefix['cold_ttft'] * 1000:.0f}ms cold = {prefix['warm_over_cold']:.2f}x; "
            f"cached {prefix['warm_cached_tokens']}/{prefix['history_tokens']} tokens "
            f"({prefix['cached_fraction']:.0%}); after its slot was reused "
            f"{prefix['tier_ttft'] * 1000:.0f}ms with {prefix['tier_cached_tokens']} cached"
        )
    if agent:
        if "error" in agent:
            print(f"\nagent chain failed: {agent['error']}")
        else:
            print_agent(agent)
    if edit:
        if "error" in edit:
            print(f"\nedit failed: {edit['error']}")
        else:
            print_edit(edit)
    summary.update(
        {
            "cases": sorted(only, key=CASES.index),
            "ceiling_tps": ceiling,
            "peak_rss_mib": rss,
            "prefix_cache": prefix,
            "agent_chain": agent,
            "edit": edit,
            "rows": [asdict(r) for r in rows],
            "args": {k: str(v) for k, v in vars(args).items()},
        }
    )
    args.out.write_text(json.dumps(summary, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
