"""`respd models`: a running server's models over HTTP — list them (loaded or not), load
one, unload one."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from respd.cli.remote import add_server_args, api_url, auth_headers


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "models",
        help="list a running server's models, or load or unload one",
        description="List a running respd's models (GET /v1/models) with whether each local "
        "model is loaded, or load / unload one (POST /v1/models/ID/load|unload, an "
        "operators' route).",
    )
    parser.add_argument("action", nargs="?", choices=["list", "load", "unload"], default="list")
    parser.add_argument("model", nargs="?", help="the model to load or unload")
    add_server_args(parser)


def run(args: argparse.Namespace) -> int:
    base = api_url(args, "/models")
    headers = auth_headers(args)
    if args.action != "list" and not args.model:
        print(f"respd models {args.action}: name the model", file=sys.stderr)
        return 2
    try:
        if args.action == "list":
            response = httpx.get(base, headers=headers, timeout=10)
        else:  # a load waits for the model to load
            url = f"{base}/{args.model}/{args.action}"
            response = httpx.post(url, headers=headers, timeout=600)
    except httpx.HTTPError as exc:
        print(f"respd models: cannot reach {base}: {exc}", file=sys.stderr)
        return 1
    if response.status_code != 200:
        print(f"respd models: {response.status_code}: {response.text}", file=sys.stderr)
        return 1
    body = response.json()
    if args.json or args.action != "list":
        print(json.dumps(body, indent=2))
        return 0
    table = Table()
    for title in ("id", "loaded", "pinned", "context", "inputs", "load error"):
        table.add_column(title)
    for card in body["data"]:
        loaded = card.get("loaded", True)
        table.add_row(
            card["id"],
            "yes" if loaded else "no",
            "yes" if card.get("pinned") else "",
            str(card.get("context_window") or ""),
            ", ".join(card.get("input_modalities") or []),
            card.get("load_error") or "",
        )
    Console(width=160).print(table)
    return 0
