"""Reloads (SIGHUP and ``POST /-/reload``): what a new file changes against what runs,
which of those changes only a restart can apply, and the record of every reload.

:func:`propose` compares the file with the *running* configuration, in which settings
that need a restart keep the values the process started with: reverting
``server.listen`` to the bound address is no change, and a second reload of a file that
still changes it names it again. :class:`Reloads` runs one reload at a time through
the daemon's ``apply`` and keeps its outcome (counts, the last applied record, whether
the last one succeeded and when one last did: ``/status`` and ``/metrics``). A reload
never reports "applied" for a change it ignored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from watchd.config.fields import ConfigError
from watchd.config.loading import load_config
from watchd.config.model import Config, shard_index
from watchd.config.secrets import ResolvedSecrets, resolve_secrets
from watchd.kits import logs
from watchd.kits.redaction import REGISTRY

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


def hold(running: Config, new: Config, settings: Iterable[str]) -> Config:
    """``new`` with each of ``settings`` (dotted paths) kept at its ``running`` value: what
    the process runs once ``new`` is applied, when those settings need a restart."""
    out: BaseModel = new
    for setting in settings:
        out = _hold(out, running, setting.split("."))
    assert isinstance(out, Config)
    return out


def _hold(new: BaseModel, running: BaseModel, path: list[str]) -> BaseModel:
    head, *rest = path
    value = getattr(running, head)
    if rest:
        value = _hold(getattr(new, head), value, rest)
    return new.model_copy(update={head: value})


@dataclass(frozen=True)
class Proposal:
    """A new configuration that loaded and validated, and what applying it means."""

    # The file's settings as they will run: restart-only ones (and ``fixed``) as they were.
    running: Config
    secrets: ResolvedSecrets
    index: int  # this replica's shard index under the new config
    paths: list[str]  # every setting that differs from what runs
    restart: list[str]  # of those, the ones only a restart applies
    restart_identities: bool


def propose(path: str | None, running: Config, *, fixed: frozenset[str]) -> Proposal:
    """Read and validate the file again (ConfigError if it is not valid) and compare it
    with the ``running`` configuration. ``fixed`` names settings the embedding pins (the
    demo's reconcile interval): changing them needs a restart too."""
    if path is None:
        raise ConfigError(["no configuration file to reload from"])
    config = load_config(path)
    secrets = resolve_secrets(config)
    index = shard_index(config)
    paths = changed(running, config)
    restart = needs_restart(paths) + [p for p in sorted(fixed) if p in paths]
    return Proposal(
        running=hold(running, config, (*RESTART_ONLY, *sorted(fixed))),
        secrets=secrets,
        index=index,
        paths=paths,
        restart=restart,
        restart_identities=restarts_identities(paths),
    )


class Notifier(Protocol):
    """The service manager (sd_notify): told a reload started, and the status after it."""

    def reloading(self) -> bool: ...

    def notify(self, **fields: str) -> bool: ...


@dataclass(frozen=True)
class Outcome:
    """One reload's result as ``POST /-/reload`` answers it (Prometheus' codes): 200
    applied, 400 the file is not a valid configuration (nothing changed), 500 applying it
    failed part-way."""

    status: int
    body: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.status == 200


# The previous configuration stays in force: said by every refused reload.
KEPT = "the previous configuration stays in force"


class Reloads:
    """Every reload's record; :meth:`run` carries one out, one at a time (a SIGHUP during
    a ``POST /-/reload`` waits its turn, so neither compares against a half-applied
    config). Like Prometheus and Alertmanager, the start-up load counts as the first
    successful one."""

    def __init__(self, wall: Callable[[], float]) -> None:
        self._wall = wall
        self.counts = {"applied": 0, "rejected": 0, "failed": 0}
        self.last: dict[str, Any] | None = None  # the last applied reload
        self.successful = True
        self.success_at = wall()
        self._one = asyncio.Lock()

    async def run(
        self,
        propose: Callable[[], Proposal],
        apply: Callable[[Proposal], Awaitable[dict[str, list[str]]]],
        *,
        notifier: Notifier,
        status_line: Callable[[], str],
    ) -> Outcome:
        """Propose (read and compare the file), then apply; ``apply`` answers which
        identities it added, removed and changed."""
        async with self._one:
            notifier.reloading()
            try:
                proposal = propose()
            except ConfigError as exc:
                self._failed("rejected")
                log.error("reload.rejected", problems=exc.problems, note=KEPT)
                notifier.notify(READY="1", STATUS="reload rejected: " + exc.problems[0][:200])
                return Outcome(400, {"status": "rejected", "problems": exc.problems, "note": KEPT})
            try:
                identities = await apply(proposal)
            except Exception as exc:
                # A bug, or a subsystem refusing its new settings: what was applied stays.
                error = REGISTRY.scrub(f"{type(exc).__name__}: {exc}")[:300]
                self._failed("failed")
                log.error("reload.failed", error=error, exc_info=True)
                notifier.notify(READY="1", STATUS="reload failed: " + error[:200])
                note = "applying the new configuration failed part-way: restart watchd"
                return Outcome(500, {"status": "failed", "error": error, "note": note})
            self.counts["applied"] += 1
            self.successful, self.success_at = True, self._wall()
            self.last = announce(proposal, identities, at=self.success_at)
            status = status_line()
            if proposal.restart:
                status += f"; restart needed for {', '.join(proposal.restart)}"
            notifier.notify(READY="1", STATUS=status)
            return Outcome(200, {"status": "applied", **self.last})

    def _failed(self, outcome: str) -> None:
        self.counts[outcome] += 1
        self.successful = False


def announce(p: Proposal, identities: dict[str, list[str]], *, at: float) -> dict[str, Any]:
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
        "at": at,
        "applied": applied,
        "needs_restart": p.restart,
        "identities": identities,
    }
