"""Where the long-running commands log: stderr, as text lines or one JSON object a line.

``--log-level`` (or ``DAGQ_LOG_LEVEL``) and ``--log-format text|json`` (or
``DAGQ_LOG_FORMAT``) of ``dagq coordinator``, ``dagq worker``, ``dagq server`` and
``dagq run``.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import click

LEVELS = ("debug", "info", "warning", "error")
LogFormat = Literal["text", "json"]
F = TypeVar("F", bound=Callable[..., Any])

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (Unix seconds), ``level``, ``logger``,
    ``message``; ``workflow_id``, ``trace_id`` and, where they apply, ``task``,
    ``attempt`` and ``span_id`` when the record concerns a workflow
    (:mod:`dagq.observability.context`); ``client``, ``method``, ``path`` and
    ``status`` for a request ``dagq server`` answered; and ``exception`` (the traceback)
    when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        # Imported here: the observability package is not for every command to load.
        from dagq.observability import context

        entry: dict[str, Any] = {
            "time": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.name == "uvicorn.access" and isinstance(record.args, tuple):
            entry.update(_request_fields(record.args))  # dagq server: one request
        concern = context.current.get()
        if concern is not None:  # the workflow, task, attempt, trace and span it is about
            entry.update(concern.fields())
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, ensure_ascii=False, default=str)


def _request_fields(args: tuple[Any, ...]) -> dict[str, Any]:
    """The fields of uvicorn's access record: client, method, path, HTTP status."""
    if len(args) != 5:
        return {}
    client, method, path, _http_version, status = args
    return {"client": client, "method": method, "path": path, "status": status}


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes (as logging's last-resort
    handler does), so code that redirects it — a task's output capture — gets the logs."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def configure(level: str, log_format: LogFormat = "text") -> None:
    """Send every dagq log record at ``level`` or above to stderr, formatted."""
    handler = _StderrHandler()
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def log_options(default_level: str) -> Callable[[F], F]:
    """``--log-level`` and ``--log-format`` for a command (``DAGQ_LOG_LEVEL``,
    ``DAGQ_LOG_FORMAT``)."""

    def decorate(function: F) -> F:
        function = click.option(
            "--log-format",
            "log_format",
            type=click.Choice(["text", "json"]),
            envvar="DAGQ_LOG_FORMAT",
            default="text",
            show_default=True,
            help="text lines, or one JSON object per line (time, level, logger, message, "
            "exception); env DAGQ_LOG_FORMAT.",
        )(function)
        return click.option(
            "--log-level",
            "log_level",
            type=click.Choice(LEVELS, case_sensitive=False),
            envvar="DAGQ_LOG_LEVEL",
            default=default_level,
            show_default=True,
            help="The least important log records shown (on stderr); env DAGQ_LOG_LEVEL.",
        )(function)

    return decorate
