"""Log lines an operator can follow: text or JSON, each carrying the id of the request it
belongs to and the label of the key that made it (never the key itself).

Both come from context variables the request middlewares set, so every logger (ours,
uvicorn's, a library's) gets them through one `logging.Filter` without passing anything
around. Prompts and other user text are logged only when `--log-prompts` is on.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

LogLevel = Literal["critical", "error", "warning", "info", "debug"]
LogFormat = Literal["text", "json"]

NONE = "-"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s %(key)s]: %(message)s"

_request_id: ContextVar[str] = ContextVar("respd_request_id", default=NONE)
_identity: ContextVar[str] = ContextVar("respd_log_identity", default=NONE)
_log_prompts = False


@dataclass(frozen=True)
class LogSettings:
    """How the process logs (`--log-level`, `--log-format`, `--log-prompts`)."""

    level: LogLevel = "info"
    format: LogFormat = "text"
    prompts: bool = False  # whether user text may be logged


@contextmanager
def request_context(request_id: str) -> Iterator[None]:
    """Log lines written while handling one request carry its id; the identity starts
    unknown. Both are restored afterwards (an in-process client shares the caller's task),
    except when an error escapes: the outer handler that logs it still names the request."""
    rid = _request_id.set(request_id)
    ident = _identity.set(NONE)
    yield
    _identity.reset(ident)
    _request_id.reset(rid)


def set_log_identity(label: str) -> None:
    """Name who is asking (a key's label) in the current request's log lines."""
    _identity.set(label)


def current_request_id() -> str:
    return _request_id.get()


def prompts_logged() -> bool:
    """Whether user text (prompts) may be logged: only when the operator asked."""
    return _log_prompts


def set_prompts_logged(enabled: bool) -> None:
    global _log_prompts
    _log_prompts = enabled


class ContextFilter(logging.Filter):
    """Adds `request_id` and `key` to every record (`-` outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = _request_id.get()
        record.key = _identity.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, request_id, key, and the
    traceback text as exc_info when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", _request_id.get()),
            "key": getattr(record, "key", _identity.get()),
        }
        args = record.args
        if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) == 5:
            # uvicorn's access line: client, method, path, HTTP version, status.
            client, method, path, _, status = args
            line |= {"client": client, "method": method, "path": path, "status": status}
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def _formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)


_CHATTY_CLIENTS = ("httpx", "httpx2", "httpcore", "httpcore2")


def configure_logging(settings: LogSettings) -> None:
    """Route every log record to stderr in the chosen format, with the request context."""
    set_prompts_logged(settings.prompts)
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(_formatter(settings.format))
    logging.basicConfig(level=settings.level.upper(), handlers=[handler], force=True)
    # HTTP clients' per-request lines (the MCP SDK's, for one) name URLs a tool's user
    # chose: only their warnings are worth a line, under `debug` everything is.
    if settings.level.lower() != "debug":
        for name in _CHATTY_CLIENTS:
            logging.getLogger(name).setLevel(logging.WARNING)


def uvicorn_log_config(settings: LogSettings) -> dict[str, Any]:
    """uvicorn's own logging (`uvicorn.Config(log_config=...)`) in the same format and with
    the same context. Text keeps uvicorn's look (the access line's `200 OK` included)."""
    if settings.format == "json":
        formatters: dict[str, Any] = {
            "default": {"()": JsonFormatter},
            "access": {"()": JsonFormatter},
        }
    else:
        formatters = {
            "default": {
                "()": "uvicorn.logging.DefaultFormatter",
                "fmt": "%(levelprefix)s [%(request_id)s %(key)s] %(message)s",
                "use_colors": None,
            },
            "access": {
                "()": "uvicorn.logging.AccessFormatter",
                "fmt": '%(levelprefix)s [%(request_id)s %(key)s] %(client_addr)s - "'
                '%(request_line)s" %(status_code)s',
            },
        }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": ContextFilter}},
        "formatters": formatters,
        "handlers": {
            "default": {
                "formatter": "default",
                "class": "logging.StreamHandler",
                "filters": ["context"],
                "stream": "ext://sys.stderr",
            },
            "access": {
                "formatter": "access",
                "class": "logging.StreamHandler",
                "filters": ["context"],
                "stream": "ext://sys.stdout",
            },
        },
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            "uvicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
        },
    }
