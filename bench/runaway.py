"""Do short turns end? 40 fixed short prompts against a real `respd serve`, twice.

A small model asked "Count from 1 to 3." may never write its end-of-turn token. This sends
40 fixed short prompts (greetings, counting, lists, one-line answers, follow-ups after a tool
output) through the Responses API, each with a fixed seed and `max_output_tokens` 512 (so a
runaway costs 512 tokens, not a whole context window), and prints the share that ends by the
model's own end of turn (`completed`) before 512 tokens, once on the server's defaults and
once with the runaway guards off (`--dry-multiplier 0 --repetition-stop 0
--max-output-tokens 0`). Turns the repetition stop cut are counted apart: they are bounded,
but not ended by the model.

    python bench/runaway.py              # starts both servers itself
    python bench/runaway.py --flags "--dry-multiplier 0.5"   # another setting to compare
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

BUDGET = 512
GUARDS_OFF = ("--dry-multiplier", "0", "--repetition-stop", "0", "--max-output-tokens", "0")

GREETINGS = [
    "Hello!",
    "Hi there, how are you?",
    "Good morning.",
    "Hey, what's up?",
    "Thanks for your help!",
    "Goodbye!",
    "Nice to meet you.",
    "Who are you?",
]
COUNTING = [
    "Count from 1 to 3.",
    "Count from 1 to 5.",
    "Count down from 5 to 1.",
    "List the even numbers from 2 to 10.",
    "What comes after 7?",
    "Count to ten in words.",
    "Say the numbers 1, 2, 3 and stop.",
    "What is 2 + 2?",
]
LISTS = [
    "List three colors.",
    "Name three fruits.",
    "Give me a list of four animals.",
    "List the days of the weekend.",
    "Name three planets.",
    "List two programming languages.",
    "Give three tips for sleeping well, one line each.",
    "Name the primary colors.",
]
ONE_LINE = [
    "What is the capital of France? Answer in one line.",
    "In one sentence, what is the sun?",
    "Answer yes or no: is water wet?",
    "What color is the sky? One word.",
    "Give a one-line definition of a cat.",
    "What is the opposite of hot?",
    "Translate 'hello' to French.",
    "Reply with just OK.",
]
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
# A question, the call the model made, the tool's output: the model answers from it.
AFTER_TOOL = [
    ("What's the weather in Paris?", {"city": "Paris"}, '{"temp_c": 18, "sky": "cloudy"}'),
    ("Is it raining in London?", {"city": "London"}, '{"temp_c": 12, "sky": "rain"}'),
    ("How warm is it in Rome?", {"city": "Rome"}, '{"temp_c": 25, "sky": "sunny"}'),
    ("Weather in Oslo please.", {"city": "Oslo"}, '{"temp_c": -3, "sky": "snow"}'),
    ("Do I need a coat in Berlin?", {"city": "Berlin"}, '{"temp_c": 4, "sky": "windy"}'),
    ("Tell me the weather in Tokyo.", {"city": "Tokyo"}, '{"temp_c": 21, "sky": "clear"}'),
    ("Is it sunny in Madrid?", {"city": "Madrid"}, '{"temp_c": 30, "sky": "sunny"}'),
    ("What's it like outside in Cairo?", {"city": "Cairo"}, '{"temp_c": 35, "sky": "hot"}'),
]


def prompts() -> list[tuple[str, dict[str, Any]]]:
    """The 40 cases: (kind, the create arguments besides model and budget)."""
    cases: list[tuple[str, dict[str, Any]]] = []
    for kind, texts in (
        ("greeting", GREETINGS),
        ("counting", COUNTING),
        ("list", LISTS),
        ("one-line", ONE_LINE),
    ):
        cases += [(kind, {"input": text}) for text in texts]
    for i, (question, args, output) in enumerate(AFTER_TOOL):
        call_id = f"call_{i}"
        history = [
            {"role": "user", "content": question},
            {
                "type": "function_call",
                "call_id": call_id,
                "name": "get_weather",
                "arguments": json.dumps(args),
            },
            {"type": "function_call_output", "call_id": call_id, "output": output},
        ]
        cases.append(("after-tool", {"input": history, "tools": [WEATHER_TOOL]}))
    return cases


@dataclass
class Outcome:
    kind: str
    status: str  # completed | incomplete | failed
    tokens: int
    looped: bool  # cut by the repetition stop (incomplete before the budget)

    @property
    def ended(self) -> bool:
        return self.status == "completed" and self.tokens < BUDGET


async def one(
    client: openai.AsyncOpenAI, model: str, seed: int, kind: str, body: dict[str, Any]
) -> Outcome:
    r = await client.responses.create(
        model=model, max_output_tokens=BUDGET, extra_body={"seed": seed}, **body
    )
    tokens = r.usage.output_tokens if r.usage else 0
    looped = r.status == "incomplete" and tokens < BUDGET
    return Outcome(kind, r.status or "", tokens, looped)


async def measure(base_url: str, concurrency: int) -> list[Outcome]:
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="sk-bench", timeout=900)
    model = (await client.models.list()).data[0].id
    gate = asyncio.Semaphore(concurrency)

    async def run(seed: int, kind: str, body: dict[str, Any]) -> Outcome:
        async with gate:
            return await one(client, model, seed, kind, body)

    return list(await asyncio.gather(*(run(i, k, b) for i, (k, b) in enumerate(prompts()))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(flags: list[str], data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "respd", "serve", "--port", str(port)]
    cmd += ["--data-dir", str(data_dir), "--store", "memory", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"respd did not start with {flags}")


def report(label: str, outcomes: list[Outcome], seconds: float) -> dict[str, Any]:
    ended = sum(o.ended for o in outcomes)
    by_kind = Counter(o.kind for o in outcomes if o.ended)
    totals = Counter(o.kind for o in outcomes)
    row = {
        "label": label,
        "ended": ended,
        "total": len(outcomes),
        "share": ended / len(outcomes),
        "looped": sum(o.looped for o in outcomes),
        "budget": sum(o.status == "incomplete" and not o.looped for o in outcomes),
        "tokens": sum(o.tokens for o in outcomes),
        "seconds": round(seconds, 1),
        "by_kind": {k: f"{by_kind[k]}/{n}" for k, n in totals.items()},
    }
    print(
        f"{label:<40} ended {ended}/{len(outcomes)} ({row['share']:.0%})  "
        f"repetition stop {row['looped']}  budget {row['budget']}  "
        f"tokens {row['tokens']}  {seconds:.0f}s  {row['by_kind']}",
        flush=True,
    )
    return row


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--flags", action="append", default=[], help="another flag set to measure")
    p.add_argument("--server-flags", default="--threads 2", help="flags every server gets")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--skip-off", action="store_true", help="skip the guards-off server")
    args = p.parse_args()
    common = shlex.split(args.server_flags)
    sets = [("defaults", [])]
    if not args.skip_off:
        sets.append(("guards off (" + " ".join(GUARDS_OFF) + ")", list(GUARDS_OFF)))
    sets += [(flags, shlex.split(flags)) for flags in args.flags]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, flags in sets:
            proc, url = start(common + flags, Path(tmp))
            try:
                started = time.monotonic()
                outcomes = asyncio.run(measure(url, args.concurrency))
                rows.append(report(label, outcomes, time.monotonic() - started))
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "runaway.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
