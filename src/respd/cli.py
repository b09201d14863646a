"""`respd` command line: a thin shell that maps flags onto `Settings` and starts the app."""

from __future__ import annotations

import argparse
import sys
from typing import Any, get_args, get_origin

from pydantic import ValidationError

from respd import __version__
from respd.config import Settings
from respd.logs import configure_logging


def _flag_type(annotation: Any) -> Any:
    args = [a for a in get_args(annotation) if a is not type(None)]
    base = args[0] if args else annotation
    if get_args(base) and all(isinstance(a, str) for a in get_args(base)):  # Literal[...]
        return str
    if base in (int, float):
        return base
    return str


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        env = "RESPD_" + name.upper()
        if field.default_factory is list:
            default_text = "none"
        elif field.default_factory is not None:
            default_text = "computed"
        else:
            default_text = repr(field.default) if field.default is not None else "none"
        choices = None
        literal_args = [a for a in get_args(field.annotation) if isinstance(a, str)]
        if literal_args:
            choices = literal_args
        help_text = f"{field.description} [env: {env}] [default: {default_text}]"
        if get_origin(field.annotation) is list:
            # Repeatable; each value may also be comma-separated.
            parser.add_argument(
                flag, dest=name, action="append", default=None, metavar=name.upper(), help=help_text
            )
            continue
        if field.annotation is bool:
            # `--flag` alone switches it on; `--flag false` (or true) is explicit.
            parser.add_argument(
                flag,
                dest=name,
                nargs="?",
                const="true",
                default=None,
                metavar="BOOL",
                help=help_text,
            )
            continue
        parser.add_argument(
            flag,
            dest=name,
            type=_flag_type(field.annotation),
            choices=choices,
            default=None,
            metavar=name.upper() if not choices else None,
            help=help_text,
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="respd",
        description="OpenAI-compatible LLM server: Responses API first, Chat Completions too.",
    )
    parser.add_argument("--version", action="version", version=f"respd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="load a model and serve the HTTP API",
        description="Load a GGUF model and serve /v1/responses, /v1/chat/completions and "
        "/v1/models. Every flag can also be set with the env var shown beside it; a flag wins "
        "over its env var.",
    )
    _add_settings_flags(serve)
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides = {
        name: getattr(args, name)
        for name in Settings.model_fields
        if getattr(args, name, None) is not None
    }
    return Settings(**overrides)


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        try:
            settings = settings_from_args(args)
        except ValidationError as exc:
            parser.error(str(exc))
        configure_logging(settings)
        from respd.server import serve  # deferred: keeps `--help` fast and model-free

        sys.exit(serve(settings))
