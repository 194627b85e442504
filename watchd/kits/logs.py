"""Structured logs: a chain of small structlog processors.

JSON lines when stderr is not a terminal (production, systemd, Kubernetes),
pretty console output on a TTY. Identity and chat id are bound per task with
contextvars. The last processor before rendering scrubs every known secret
value from every field, so a token that slipped into an exception message
still never reaches a log line.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

from watchd.kits.redaction import redact_secrets


def _one_line(
    _logger: Any, _name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """`warnings` messages end in a newline; a log event should not."""
    event = event_dict.get("event")
    if isinstance(event, str):
        event_dict["event"] = event.rstrip()
    return event_dict


# syslog priorities by level, as journald reads a "<N>" line prefix (SyslogLevelPrefix=,
# on by default): `journalctl -p warning` then shows warnings and worse.
PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2, "exception": 3}


def writes_to_journal(stream: TextIO) -> bool:
    """Whether ``stream`` is the journal's stream systemd connected (``JOURNAL_STREAM`` is
    its ``device:inode``; a stream redirected elsewhere under the same unit is not)."""
    expected = os.environ.get("JOURNAL_STREAM", "")
    if not expected:
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return expected == f"{st.st_dev}:{st.st_ino}"


def _with_priority(renderer: Any) -> Any:
    """``renderer`` with each line prefixed by its syslog priority for journald."""

    def render(logger: Any, name: str, event_dict: Any) -> Any:
        prefix = f"<{PRIORITY.get(str(event_dict.get('level', 'info')), 6)}>"
        return prefix + renderer(logger, name, event_dict)

    return render


def configure(
    *, level: str = "info", json: bool | None = None, stream: TextIO | None = None
) -> None:
    stream = stream or sys.stderr
    if json is None:
        json = not stream.isatty()
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    if writes_to_journal(stream):
        renderer = _with_priority(renderer)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    processors: list[Any] = [
        *shared,
        structlog.processors.format_exc_info,
        redact_secrets,
        renderer,
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        # Bound once per logger: an unbound proxy re-binds on every call (~10 µs).
        cache_logger_on_first_use=True,
    )
    # Libraries (OpenTelemetry's SDK and exporters, aiohttp, asyncio) log through the
    # standard library, and `warnings` through its py.warnings logger: all of it is
    # rendered by the same chain, so a JSON log stays JSON lines, secrets scrubbed.
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                *shared,
                structlog.stdlib.add_logger_name,
                structlog.stdlib.ExtraAdder(),
                _one_line,
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                redact_secrets,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_watchd", False)]:
        root.removeHandler(old)
    handler._watchd = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.captureWarnings(True)


def get(name: str) -> Any:
    return structlog.get_logger(name)
