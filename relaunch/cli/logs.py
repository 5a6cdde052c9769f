"""How the long-running processes (worker, watcher, console) log: text or JSON lines, at a level
of their own, with each record's structured fields kept (``extra={"error": ...}``)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import click

LOG_FORMAT_ENV = "RELAUNCH_LOG_FORMAT"
LOG_LEVEL_ENV = "RELAUNCH_LOG_LEVEL"
FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")

# The attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(
    {*logging.LogRecord("", 0, "", 0, "", None, None).__dict__, "message", "asctime", "taskName"}
)
MAX_FIELD = 2000  # characters of one field's value in a line


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record's structured fields (its ``extra=``), values made JSON-safe and bounded."""
    out: dict[str, Any] = {}
    for key, value in record.__dict__.items():
        if key in _STANDARD or key.startswith("_"):
            continue
        if not isinstance(value, str | int | float | bool) and value is not None:
            value = value if isinstance(value, list | dict) else str(value)
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                value = str(value)
        if isinstance(value, str) and len(value) > MAX_FIELD:
            value = value[:MAX_FIELD] + "…"
        out[key] = value
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, the process's
    label when it has one, the record's fields, and the exception's traceback if any."""

    def __init__(self, label: str | None = None) -> None:
        super().__init__()
        self.label = label

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.label:
            line["process"] = self.label
        for key, value in fields(record).items():
            line.setdefault(key, value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``time LEVEL [label] logger message key=value ...``: the fields after the message."""

    def __init__(self, label: str | None = None) -> None:
        who = f"{label} " if label else ""
        super().__init__(f"%(asctime)s %(levelname)s {who}%(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extra = fields(record)
        if not extra:
            return text
        pairs = " ".join(f"{key}={json.dumps(value, default=str)}" for key, value in extra.items())
        head, sep, rest = text.partition("\n")  # a traceback stays below the line
        return f"{head} {pairs}{sep}{rest}"


def setup(label: str | None = None, fmt: str = "text", level: str = "info") -> None:
    """Log to stderr in ``fmt`` (text or json) at ``level``; ``label`` (e.g. ``worker[2/4]``)
    names the process in each line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(label) if fmt == "json" else TextFormatter(label))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


F = TypeVar("F", bound=Callable[..., Any])


def log_options(fn: F) -> F:
    """``--log-format`` and ``--log-level`` (also from RELAUNCH_LOG_FORMAT / RELAUNCH_LOG_LEVEL)."""
    fn = click.option(
        "--log-level",
        type=click.Choice(LEVELS, case_sensitive=False),
        default="info",
        show_default=True,
        envvar=LOG_LEVEL_ENV,
        show_envvar=True,
        help="The least severe messages this process logs.",
    )(fn)
    fn = click.option(
        "--log-format",
        type=click.Choice(FORMATS),
        default="text",
        show_default=True,
        envvar=LOG_FORMAT_ENV,
        show_envvar=True,
        help="text: one readable line each, fields as key=value after the message; json: one "
        "JSON object a line (time, level, logger, message, and every field).",
    )(fn)
    return fn
