"""What a SIGHUP reload changed, and which of those changes only a restart can apply.

Pure: compares two validated configs field by field. The daemon applies what it
can and names every setting in :func:`needs_restart` (logged and in ``/status``)
— a reload never reports "applied" for a change it ignored.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from watchd.config.model import Config

# Settings the running process cannot take over: the listening socket and its request
# size limit, the span exporter (and its SDK threads), where state lives.
RESTART_ONLY = (
    "server.listen",
    "server.max_body_bytes",
    "telemetry",
    "state_dir",
)


def changed(old: Config, new: Config) -> list[str]:
    """Dotted paths of every setting that differs (lists compare whole: ``identities``)."""
    out: list[str] = []
    _walk(old, new, "", out)
    return out


def _walk(old: Any, new: Any, path: str, out: list[str]) -> None:
    if isinstance(old, BaseModel) and isinstance(new, BaseModel) and type(old) is type(new):
        for name in type(old).model_fields:
            _walk(getattr(old, name), getattr(new, name), f"{path}.{name}" if path else name, out)
        return
    if old != new:
        out.append(path)


def needs_restart(paths: list[str]) -> list[str]:
    """The changed settings a reload cannot apply."""
    return [p for p in paths if any(p == r or p.startswith(r + ".") for r in RESTART_ONLY)]
