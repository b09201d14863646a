"""`respd providers`: a running server's routing table, read over HTTP from
`/v1/providers` and printed as a table (or as JSON)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from respd.cli.remote import add_server_args, api_url, auth_headers

COLUMNS = (
    ("model", "model"),
    ("provider", "provider"),
    ("endpoint", "endpoint"),
    ("healthy", "healthy"),
    ("circuit", "circuit"),
    ("running", "running"),
    ("requests", "requests"),
    ("failed", "failed"),
    ("fallbacks", "fallbacks"),
    ("latency_ms", "latency ms"),
    ("throughput_tps", "tokens/s"),
    ("last_error", "last error"),
)


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "providers",
        help="show a running server's providers: health, circuit, latency, throughput",
        description="Print the routing table of a running respd (GET /v1/providers): each "
        "provider of each routed model with its health, circuit state, requests, failures, "
        "fallbacks, measured latency and throughput.",
    )
    add_server_args(parser)


def run(args: argparse.Namespace) -> int:
    headers = auth_headers(args)
    url = api_url(args, "/providers")
    try:
        response = httpx.get(url, headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        print(f"respd providers: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    if response.status_code != 200:
        print(
            f"respd providers: {url} answered {response.status_code}: {response.text}",
            file=sys.stderr,
        )
        return 1
    rows = response.json()["data"]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no routed models (entries sharing a model_id, or naming a provider)")
        return 0
    table = Table()
    for _, title in COLUMNS:
        table.add_column(title)
    for row in rows:
        table.add_row(*("" if row.get(k) is None else str(row[k]) for k, _ in COLUMNS))
    Console(width=200).print(table)
    return 0
