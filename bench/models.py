"""Several local models behind one server: what loading one on demand costs, respd beside
llama.cpp's llama-server in router mode.

Both servers get the same folder of three GGUFs (hard links of the embedded SmolLM2-135M
under three names, in a temp dir, so all three share one inode and the page cache: "cold"
here means not loaded in the server, never read from disk), the same threads, context, one
slot per model and a limit of two models loaded at once (`--models-max 2` on both). Each
round, on each server in turn (alternating which goes first), with every model unloaded
through the server's own route beforehand:

- cold: a request for A, nothing loaded;
- warm: A again;
- cold, beside one: B, with A loaded and room for B;
- cold, evicting: C, which unloads A (the least recently used) to make room, sent as soon
  as B's stream ends (or `--pause` seconds later; how long A had then been idle is printed);
- reloaded: A again, after its eviction.

Every request is a streamed chat completion (`POST /v1/chat/completions`, 8 tokens,
temperature 0) whose user message no earlier request sent (the same sequence on both
servers); only the chat template's preamble, the same in every prompt, can come from a
slot's cache, and only on the warm request. The figure is the time from sending it to the
first chunk that carries content. Printed: the median per case over rounds and the
respd / llama-server ratio, and each load's duration as the servers' own logs time it
(kept in `bench/results/models-logs/`). JSON goes to `bench/results/models.json`.

    .venv/bin/python bench/models.py                  # 3 rounds
    .venv/bin/python bench/models.py --quick          # 1 round
    .venv/bin/python bench/models.py --llama-server /path/to/llama-server
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
NAMES = ("alpha", "bravo", "charlie")
CASES = ("cold", "warm", "cold, beside one", "cold, evicting", "reloaded")
MAX_TOKENS = 8
SUBJECTS = (
    "the sea", "a clock", "winter", "a river", "bread", "the moon", "a bridge", "paper",
    "a garden", "rain", "a violin", "salt", "a lighthouse", "autumn", "a kettle", "glass",
    "a forest", "copper", "a train", "honey", "a mountain", "ink", "a harbor", "snow",
)  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def embedded_model() -> Path:
    sys.path.insert(0, str(ROOT / "src"))
    from respd.config import embedded_model_path

    return embedded_model_path()


def default_llama_server() -> str | None:
    found = os.environ.get("RESPD_TEST_LLAMA_SERVER")
    if found:
        return found
    with contextlib.suppress(subprocess.CalledProcessError, OSError):
        script = ROOT / "scripts" / "llama-server.sh"
        return subprocess.run([str(script)], check=True, capture_output=True, text=True).stdout
    return None


def cpu_has_amx() -> bool:
    # respd's `--repack auto` turns repacking off on AMX CPUs; llama-server is told the same.
    with contextlib.suppress(OSError):
        return " amx" in Path("/proc/cpuinfo").read_text()
    return False


@dataclass
class Server:
    """One router: how to list its models, unload one, and tell whether one is loaded."""

    name: str
    base: str
    ids: dict[str, str]  # our name -> the server's model id
    unload: Callable[[httpx.Client, str], None]
    loaded: Callable[[httpx.Client], set[str]]
    ttft: dict[str, list[float]] = field(default_factory=dict)
    a_idle: list[float] = field(default_factory=list)  # from A's last stream's end to C
    notes: list[str] = field(default_factory=list)


def respd_loaded(http: httpx.Client) -> set[str]:
    return {c["id"] for c in http.get("/v1/models").json()["data"] if c.get("loaded")}


def respd_unload(http: httpx.Client, model: str) -> None:
    http.post(f"/v1/models/{model}/unload").raise_for_status()


def llama_loaded(http: httpx.Client) -> set[str]:
    cards = http.get("/models").json()["data"]
    return {c["id"] for c in cards if c["status"]["value"] != "unloaded"}


def llama_unload(http: httpx.Client, model: str) -> None:
    http.post("/models/unload", json={"model": model}).raise_for_status()


@contextlib.contextmanager
def running(
    cmd: list[str], base: str, ready: str, log: Path, env: dict[str, str] | None = None
) -> Iterator[None]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{cmd[0]} exited:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + ready, timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"{cmd[0]} did not answer {ready}:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def model_ids(http: httpx.Client, path: str) -> dict[str, str]:
    """Our three names to the ids the server derived from the file names."""
    listed = [c["id"] for c in http.get(path).json()["data"]]
    ids = {}
    for name in NAMES:
        match = [i for i in listed if i.lower().split(".")[0] == name]
        if len(match) != 1:
            raise SystemExit(f"{http.base_url}{path} lists {listed}, no single id for {name}")
        ids[name] = match[0]
    return ids


def first_token(http: httpx.Client, model: str, prompt: str) -> float:
    """Seconds from sending a streamed chat completion to its first chunk with content."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    ttft = None
    # A new connection per request, on both servers: llama-server's router closes kept-alive
    # connections the client may still think reusable.
    headers = {"Connection": "close"}
    with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{model}: {r.status_code} {r.read()[:500]!r}")
        for line in r.iter_lines():
            if ttft is not None or not line.startswith("data: ") or line == "data: [DONE]":
                continue  # read the stream out, so the request ends before the next
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                ttft = time.perf_counter() - started
    if ttft is None:
        raise RuntimeError(f"{model}: the stream carried no content")
    return ttft


def prompt_sequence(start: int) -> Iterator[str]:
    k = start
    while True:
        yield f"Write one sentence about {SUBJECTS[k % len(SUBJECTS)]} (note {k})."
        k += 1


def settle(http: httpx.Client, server: Server, want: Callable[[set[str]], bool]) -> bool:
    """Waits (a few seconds at most) for the loaded set to satisfy `want`: llama-server
    stops a child after answering its unload route."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if want(server.loaded(http)):
            return True
        time.sleep(0.1)
    return False


def unload_all(http: httpx.Client, server: Server) -> None:
    for model in server.loaded(http):
        server.unload(http, model)
    if not settle(http, server, lambda loaded: not loaded):
        raise SystemExit(f"{server.name}: models still loaded: {server.loaded(http)}")


def one_round(
    http: httpx.Client, server: Server, prompts: Iterator[str], pause: float
) -> dict[str, float]:
    a, b, c = (server.ids[n] for n in NAMES)
    unload_all(http, server)
    got = {"cold": first_token(http, a, next(prompts))}
    got["warm"] = first_token(http, a, next(prompts))
    a_done = time.perf_counter()
    got["cold, beside one"] = first_token(http, b, next(prompts))
    time.sleep(pause)
    server.a_idle.append(time.perf_counter() - a_done)
    got["cold, evicting"] = first_token(http, c, next(prompts))
    # The reload is only a reload if the limit actually pushed A out.
    if settle(http, server, lambda loaded: a not in loaded):
        got["reloaded"] = first_token(http, a, next(prompts))
    else:
        next(prompts)
        server.notes.append(f"{a} still loaded after {b} and {c}: no eviction to time")
    return got


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="1 round")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx-size", type=int, default=2048, help="per slot, one slot per model")
    p.add_argument("--llama-server", default=None, help="default: scripts/llama-server.sh")
    p.add_argument(
        "--pause", type=float, default=0.0, help="seconds to wait after B's stream before C"
    )
    args = p.parse_args()
    if args.quick:
        args.rounds = 1
    llama_bin = (args.llama_server or default_llama_server() or "").strip()
    repack = not cpu_has_amx()
    with tempfile.TemporaryDirectory(prefix="bench-models-") as tmp_name:
        tmp = Path(tmp_name)
        logs = ROOT / "bench" / "results" / "models-logs"  # kept for a failed run
        logs.mkdir(parents=True, exist_ok=True)
        folder = tmp / "models"
        folder.mkdir()
        model = embedded_model()
        for name in NAMES:
            os.link(model, folder / f"{name}.Q8_0.gguf")
        with contextlib.ExitStack() as stack:
            servers: list[Server] = []
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            cmd = [
                sys.executable, "-m", "respd", "serve", "--port", str(port),
                "--models-dir", str(folder), "--models-max", "2",
                "--threads", str(args.threads), "--ctx-size", str(args.ctx_size),
                "--parallel", "1", "--repack", "on" if repack else "off",
                "--store", "memory", "--data-dir", str(tmp / "respd"), "--log-level", "info",
            ]  # fmt: skip
            # Its /health looks at the first loaded model: with none loaded yet, ask /v1/models.
            stack.enter_context(running(cmd, base, "/v1/models", logs / "respd.log"))
            with httpx.Client(base_url=base, timeout=10) as http:
                ids = model_ids(http, "/v1/models")
            servers.append(Server("respd", base, ids, respd_unload, respd_loaded))
            if llama_bin and router_mode(llama_bin):
                port = free_port()
                base = f"http://127.0.0.1:{port}"
                # Flags beside --models-dir are handed to every child llama-server it spawns.
                cmd = [
                    llama_bin, "--host", "127.0.0.1", "--port", str(port),
                    "--models-dir", str(folder), "--models-max", "2",
                    "-t", str(args.threads), "-tb", str(args.threads),
                    "-c", str(args.ctx_size), "-np", "1", "-b", "512", "-ub", "512",
                    "--repack" if repack else "--no-repack", "--no-webui",
                ]  # fmt: skip
                # respd's default `--poll 0` is OpenMP's passive wait; this build's own
                # `--poll` does not reach OpenMP, so its children get the same policy by the
                # environment they inherit. Spinning threads crawl on a shared 2-core host.
                passive = {"OMP_WAIT_POLICY": "PASSIVE"}
                log = logs / "llama-server.log"
                stack.enter_context(running(cmd, base, "/models", log, passive))
                with httpx.Client(base_url=base, timeout=10) as http:
                    ids = model_ids(http, "/models")
                servers.append(Server("llama-server", base, ids, llama_unload, llama_loaded))
            else:
                print(f"llama-server with router mode not found ({llama_bin!r}): respd alone")
            start_load = os.getloadavg()
            measure(args, servers)
            load = os.getloadavg()
    report(args, servers, (start_load[0], *load), llama_bin, logged_loads(logs))


def router_mode(binary: str) -> bool:
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
    return "--models-dir" in help_text and "--models-max" in help_text


def measure(args: argparse.Namespace, servers: list[Server]) -> None:
    for server in servers:
        server.ttft = {case: [] for case in CASES}
    with contextlib.ExitStack() as stack:
        clients = {
            s.name: stack.enter_context(httpx.Client(base_url=s.base, timeout=300)) for s in servers
        }
        # One untimed load each, so no timed one pays for what happens once: the file entering
        # the page cache, and for respd llama.cpp's set-up in its process.
        for server in servers:
            first_token(clients[server.name], server.ids[NAMES[0]], "Say hello.")
        for round_no in range(args.rounds):
            order = servers if round_no % 2 == 0 else list(reversed(servers))
            for server in order:
                # The same prompts for both servers in a round, new ones every round.
                prompts = prompt_sequence(round_no * 5)
                got = one_round(clients[server.name], server, prompts, args.pause)
                for case, seconds in got.items():
                    server.ttft[case].append(seconds)
                shown = "  ".join(f"{case} {ms(s)}" for case, s in got.items())
                print(f"round {round_no + 1} {server.name:<12} {shown}", flush=True)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def logged_loads(logs: Path) -> dict[str, list[float]]:
    """Each load as the servers' own logs time it, the untimed first one left out: respd's
    "loaded NAME in Ss" (tenths only), and for llama-server's router the time from spawning
    a child to proxying it the first request (the child's whole start, in milliseconds)."""
    found: dict[str, list[float]] = {}
    respd_log = logs / "respd.log"
    if respd_log.exists():
        found["respd"] = [
            float(s) for s in re.findall(r"loaded \S+ in ([\d.]+)s", respd_log.read_text())
        ][1:]
    llama_log = logs / "llama-server.log"
    if llama_log.exists():
        spawned: dict[str, float] = {}
        took = []
        # The router's lines carry no [pid] prefix; stamps are minutes.seconds.ms.us.
        stamp = r"^(\d+)\.(\d+)\.(\d+)\.(\d+) I srv\s+"
        for line in llama_log.read_text(errors="replace").splitlines():
            m = re.match(stamp + r"(load: spawning|proxy_reques).* on port (\d+)", line)
            if not m:
                continue
            minutes, secs, millis, micros = (int(g) for g in m.groups()[:4])
            at = minutes * 60 + secs + millis / 1e3 + micros / 1e6
            if m[5].startswith("load"):
                spawned[m[6]] = at
            elif m[6] in spawned:
                took.append(at - spawned.pop(m[6]))
        found["llama-server"] = took[1:]
    return found


def report(
    args: argparse.Namespace,
    servers: list[Server],
    load: tuple[float, ...],
    llama_bin: str,
    loads_logged: dict[str, list[float]],
) -> None:
    by_name = {s.name: s for s in servers}
    respd = by_name["respd"]
    llama = by_name.get("llama-server")
    print(
        f"\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, load average (1 min) "
        f"{load[0]:.2f} at the start, {load[1]:.2f} at the end (5 min {load[2]:.2f}); "
        f"--threads {args.threads}, "
        f"ctx {args.ctx_size}, 1 slot per model, --models-max 2, {args.rounds} rounds, "
        f"TTFT medians"
    )
    print("| case                      | respd ms | llama-server ms | respd / llama-server |")
    print("|---------------------------|----------|-----------------|----------------------|")
    rows = []

    def median(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    for case in CASES:
        mine = median(respd.ttft[case])
        theirs = median(llama.ttft[case]) if llama else None
        ratio = mine / theirs if mine is not None and theirs else None
        cells = [
            f"{mine * 1000:.0f}" if mine is not None else "not measured",
            f"{theirs * 1000:.0f}" if theirs is not None else "not measured",
            f"{ratio:.2f}" if ratio is not None else "n/a",
        ]
        print(f"| {case:<25} | {cells[0]:>8} | {cells[1]:>15} | {cells[2]:>20} |")
        rows.append(
            {
                "case": case,
                "respd_ms": [s * 1000 for s in respd.ttft[case]],
                "llama_server_ms": [s * 1000 for s in llama.ttft[case]] if llama else None,
                "respd_median_ms": mine * 1000 if mine is not None else None,
                "llama_server_median_ms": theirs * 1000 if theirs is not None else None,
                "ratio": ratio,
            }
        )
    # The load itself, near enough: what a cold first token costs over a warm one.
    for server in servers:
        loads = [c - w for c, w in zip(server.ttft["cold"], server.ttft["warm"], strict=True)]
        if loads:
            print(f"{server.name}: cold - warm, median over rounds {ms(statistics.median(loads))}")
    for name, took in loads_logged.items():
        if took:
            typical = ms(statistics.median(took))
            print(f"{name}: load as its log times it, median of {len(took)}: {typical}")
    for server in servers:
        if server.a_idle:
            idle = statistics.median(server.a_idle)
            print(f"{server.name}: A idle for {ms(idle)} (median) when C was sent")
        for note in server.notes:
            print(f"{server.name}: {note}")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cores": os.cpu_count(),
        "loadavg_1min_start_end": list(load[:2]),
        "loadavg_5min_end": load[2],
        "threads": args.threads,
        "ctx_size": args.ctx_size,
        "rounds": args.rounds,
        "pause": args.pause,
        "logged_load_ms": {k: [x * 1000 for x in v] for k, v in loads_logged.items()},
        "llama_server": llama_bin or None,
        "rows": rows,
        "notes": {s.name: s.notes for s in servers},
        "a_idle_ms": {s.name: [x * 1000 for x in s.a_idle] for s in servers},
    }
    (out / "models.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
