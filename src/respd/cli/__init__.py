"""`respd` command line: `serve` maps flags onto `Settings` and starts the app; the other
commands (one module each here) pull models or talk to a running server."""

from __future__ import annotations

import argparse
import sys
from typing import Any, get_args, get_origin

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from respd import __version__
from respd.cli import models, providers, pull
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
    """One flag per settings field, listed under the title of the concern it belongs to."""
    for concern in Settings.concerns():
        group = parser.add_argument_group(concern.model_config.get("title"))
        for name, field in concern.model_fields.items():
            _add_flag(group, name, field)


def _default_text(field: FieldInfo) -> str:
    if field.default_factory is list:
        return "none"
    if field.default_factory is not None:
        return "computed"
    return repr(field.default) if field.default is not None else "none"


def _add_flag(group: argparse._ArgumentGroup, name: str, field: FieldInfo) -> None:
    flag = "--" + name.replace("_", "-")
    env = "RESPD_" + name.upper()
    help_text = f"{field.description} [env: {env}] [default: {_default_text(field)}]"
    if get_origin(field.annotation) is list:
        # Repeatable; each value may also be comma-separated.
        group.add_argument(
            flag, dest=name, action="append", default=None, metavar=name.upper(), help=help_text
        )
    elif field.annotation is bool:
        # `--flag` alone switches it on; `--flag false` (or true) is explicit.
        group.add_argument(
            flag,
            dest=name,
            nargs="?",
            const="true",
            default=None,
            metavar="BOOL",
            help=help_text,
        )
    else:
        choices = [a for a in get_args(field.annotation) if isinstance(a, str)] or None
        group.add_argument(
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
    _add_serve_parser(sub)
    providers.add_parser(sub)
    models.add_parser(sub)
    pull.add_parser(sub)
    return parser


def _add_serve_parser(sub: argparse._SubParsersAction[Any]) -> argparse.ArgumentParser:
    serve: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="load a model and serve the HTTP API",
        description="Load a GGUF model and serve /v1/responses, /v1/chat/completions and "
        "/v1/models. Every flag can also be set with the env var shown beside it; a flag wins "
        "over its env var.",
    )
    _add_settings_flags(serve)
    return serve


def serve_help() -> str:
    """Exactly what `respd serve --help` prints, wrapped as argparse wraps it: to the
    terminal's width, or to `$COLUMNS` where that is set."""
    sub = argparse.ArgumentParser(prog="respd").add_subparsers()
    return _add_serve_parser(sub).format_help()


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
        configure_logging(settings.log_settings())
        settings.apply_wait_policy()  # before llama.cpp's OpenMP runtime loads
        from respd.server import serve  # deferred: keeps `--help` fast and model-free

        sys.exit(serve(settings))
    if args.command == "providers":
        sys.exit(providers.run(args))
    if args.command == "models":
        sys.exit(models.run(args))
    if args.command == "pull":
        sys.exit(pull.run(args))
