"""Structured logs: a chain of small structlog processors.

JSON lines when stderr is not a terminal (production, systemd, Kubernetes),
pretty console output on a TTY. Identity and chat id are bound per task with
contextvars. The last processor before rendering scrubs every known secret
value from every field, so a token that slipped into an exception message
still never reaches a log line.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

from watchd.secrets import REGISTRY


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return REGISTRY.scrub(value)
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_scrub(v) for v in value)
    return value


def redact_secrets(
    _logger: Any, _name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for key, value in list(event_dict.items()):
        event_dict[key] = _scrub(value)
    return event_dict


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
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
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
    # aiohttp and asyncio log through the standard library; route them at WARNING.
    logging.basicConfig(level=logging.WARNING, stream=stream, format="%(name)s: %(message)s")


def get(name: str) -> Any:
    return structlog.get_logger(name)
