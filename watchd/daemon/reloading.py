"""What a SIGHUP reload changed, and which of those changes only a restart can apply.

Pure: compares two validated configs field by field. The daemon applies what it
can and names every setting in :func:`needs_restart` (logged and in ``/status``)
— a reload never reports "applied" for a change it ignored.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from watchd.config.fields import ConfigError
from watchd.config.loading import load_config
from watchd.config.model import Config, shard_index
from watchd.config.secrets import ResolvedSecrets, resolve_secrets
from watchd.kits import logs

log = logs.get("watchd.daemon")

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


def restarts_identities(paths: list[str]) -> bool:
    """Whether a change is to settings every watcher, detector verdict or quota poll reads
    at start: applying it means restarting each identity (clocks and alerts are kept)."""
    return any(
        p == "reconcile_interval"
        or p.startswith(("detection", "quota", "forecast", "cost"))
        or p == "chat_link_template"
        for p in paths
    )


@dataclass(frozen=True)
class Proposal:
    """A new configuration that loaded and validated, and what applying it means."""

    config: Config
    secrets: ResolvedSecrets
    index: int  # this replica's shard index under the new config
    paths: list[str]  # every setting that changed
    restart: list[str]  # of those, the ones only a restart applies
    restart_identities: bool


def propose(path: str | None, previous: Config, *, fixed: frozenset[str]) -> Proposal:
    """Read and validate the file again (ConfigError if it is not valid). ``fixed`` names
    settings the embedding pins (the demo's reconcile interval): changing them needs a
    restart too."""
    if path is None:
        raise ConfigError(["no configuration file to reload from"])
    config = load_config(path)
    secrets = resolve_secrets(config)
    index = shard_index(config)
    paths = changed(previous, config)
    restart = needs_restart(paths) + [p for p in sorted(fixed) if p in paths]
    return Proposal(config, secrets, index, paths, restart, restarts_identities(paths))


def announce(p: Proposal, identities: dict[str, list[str]]) -> dict[str, Any]:
    """Log what a reload applied and what it could not; the record ``/status`` shows."""
    applied = [path for path in p.paths if path not in p.restart]
    log.info("reload.applied", settings=applied, needs_restart=p.restart, **identities)
    for setting in p.restart:
        log.warning(
            "reload.needs_restart",
            setting=setting,
            note="changed in the file but not applied: restart watchd to use it",
        )
    return {
        "at": time.time(),
        "applied": applied,
        "needs_restart": p.restart,
        "identities": identities,
    }
