"""`respd pull`: a GGUF model (and its projector) from the Hugging Face hub into respd's
cache, printing where it landed and the `respd serve` line that uses it."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "pull",
        help="download a GGUF model from the Hugging Face hub into the cache",
        description="Download a GGUF model from a Hugging Face hub repository (and its mmproj "
        "projector, when the repository has one), verify its sha256, and keep it in respd's "
        "cache. REPO:QUANT picks a quant (Q4_K_M, Q8_0, ...); REPO:FILE.gguf names a file; "
        "REPO alone picks Q4_K_M, else Q4_K_S, Q4_0, Q5_K_M, Q8_0, else the first GGUF. "
        "An interrupted pull resumes. HF_TOKEN authenticates, HF_ENDPOINT names a mirror.",
    )
    parser.add_argument("ref", metavar="REPO[:QUANT|:FILE]", help="e.g. owner/name:Q4_K_M")
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="where pulled models are kept [env: RESPD_HUB_CACHE] [default: ~/.cache/respd/hub]",
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="use the cache only, never the network (also HF_HUB_OFFLINE=1)",
    )


def run(args: argparse.Namespace) -> int:
    from respd import hub  # deferred: huggingface_hub is imported only by this command

    try:
        ref = hub.parse_ref(args.ref)
        pulled = hub.pull(ref, cache_dir=args.cache_dir, offline=args.offline)
    except (ValueError, hub.HubError) as exc:
        print(f"respd pull: {exc}", file=sys.stderr)
        return 1
    # The reference to serve names what was picked, so that it keeps meaning this file.
    served = ref if ref.file or ref.quant else hub.HubRef(ref.repo, file=pulled.file)
    env = f"RESPD_HUB_CACHE={args.cache_dir} " if args.cache_dir else ""
    projector = f" --mmproj {pulled.mmproj_path}" if pulled.mmproj_path else ""
    print(f"model: {pulled.path}")
    if pulled.mmproj_path is not None:
        print(f"projector: {pulled.mmproj_path}")
    print(f"serve it with: {env}respd serve --model {served}{projector}")
    return 0
