"""What the commands that talk to a running server share: where it is, the operators'
key, and printing its JSON as sent."""

from __future__ import annotations

import argparse
import os

DEFAULT_URL = "http://127.0.0.1:8080"


def add_server_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get("RESPD_URL", DEFAULT_URL),
        help=f"the server's base URL [env: RESPD_URL] [default: {DEFAULT_URL}]",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("RESPD_ADMIN_KEY"),
        help="the server's --metrics-api-key (or an API key when it has none) "
        "[env: RESPD_ADMIN_KEY]",
    )
    parser.add_argument("--json", action="store_true", help="print the JSON as the server sent it")


def api_url(args: argparse.Namespace, path: str) -> str:
    """`path` (under /v1) on the server `--url` names, with or without its /v1."""
    return args.url.rstrip("/").removesuffix("/v1") + "/v1" + path


def auth_headers(args: argparse.Namespace) -> dict[str, str]:
    return {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
