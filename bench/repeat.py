"""Run `bench.py` several times and report each run's ratios and their medians.

One run's ratios move by several percent on a shared machine; the median of three runs,
each interleaving the servers level by level (see bench.py), is the figure to quote. Every
argument after `--` goes to bench.py unchanged; each run writes its JSON beside the others.

    .venv/bin/python bench/repeat.py --runs 3 -- --llama-server PATH --only levels,ceiling
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_once(i: int, out_dir: Path, bench_args: list[str]) -> dict[str, Any]:
    out = out_dir / f"repeat-{i + 1}.json"
    cmd = [sys.executable, str(ROOT / "bench" / "bench.py"), *bench_args, "--out", str(out)]
    print(f"run {i + 1}: {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True)
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def figures(summary: dict[str, Any]) -> dict[str, float]:
    """The figures to compare across runs: ratios to llama-server per level and API, the
    single stream over the in-process ceiling, and peak RSS respd / llama-server."""
    out = {f"{k} / llama-server": float(v) for k, v in summary.get("ratios", {}).items()}
    if "respd_single_over_ceiling" in summary:
        out["respd single stream / ceiling"] = float(summary["respd_single_over_ceiling"])
    rss = summary.get("peak_rss_mib") or {}
    if rss.get("respd") and rss.get("llama-server"):
        out["peak RSS respd / llama-server"] = rss["respd"] / rss["llama-server"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then bench.py's arguments")
    args = p.parse_args()
    bench_args = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args
    args.out_dir.mkdir(parents=True, exist_ok=True)
    runs = [figures(run_once(i, args.out_dir, bench_args)) for i in range(args.runs)]
    names = [k for k in runs[0] if all(k in r for r in runs)]
    print(f"\n| figure | {' | '.join(f'run {i + 1}' for i in range(len(runs)))} | median |")
    print(f"|---|{'---|' * len(runs)}---|")
    for name in names:
        values = [r[name] for r in runs]
        cells = " | ".join(f"{v:.2f}" for v in values)
        print(f"| {name} | {cells} | {statistics.median(values):.2f} |")


if __name__ == "__main__":
    main()
