"""The state flusher, and what it says when state cannot be kept.

Once a second, or at once (after HURRY_GATHER) when an owner hurries it — a chat's
observed transition or tombstone — the pending state (chat clocks, alerts, group state)
is committed off the loop (up to HOLD_MAX later while a burst is fired or a notification
of a thousand alerts or more is sent, so serialising their rows and that work do not
share the interpreter: ``StateFile.holding``). When a
write fails — disk full, read-only filesystem, I/O error — the daemon keeps watching and
alerting: the batch stays pending, the flush is retried with backoff (1 s doubling to
60 s), every failure is counted, and **StateNotPersisted** (critical) fires until a write
succeeds again (a small probe write while nothing is pending). Neither the flush nor the
probe runs SQL on the loop: both wait on the state writer's thread. When the database was
found corrupt at start and moved aside, **StateReset** says so for an hour, so that
nobody is surprised by notifications sent again for incidents already known.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sqlite3
import time

from watchd.alerting.model import Alert, fingerprint
from watchd.detection.detector import Detector
from watchd.kits import logs
from watchd.kits.backoff import Backoff
from watchd.store.sqlite import StateFile

log = logs.get("watchd.state")

FLUSH_EVERY = 1.0
# A hurried flush (an observed transition) waits this long for others to join it, and
# comes no sooner than this after the last flush: a burst of transitions is one commit.
HURRY_GATHER = 0.1
RESET_SHOWN = 3600.0  # StateReset stays firing this long after the start that reset state


class StateWatch:
    def __init__(self, *, db: StateFile, detector: Detector, state_dir: str) -> None:
        self.db = db
        self.detector = detector
        self.state_dir = state_dir
        self.instance = socket.gethostname()
        self._fp_failing = fingerprint(self.instance, state_dir, "StateNotPersisted")
        self._fp_reset = fingerprint(self.instance, state_dir, "StateReset")
        self._reset_at: float | None = None
        self.backoff = Backoff(base=FLUSH_EVERY, cap=60.0, jitter=0.0)

    def _labels(self, name: str, severity: str) -> dict[str, str]:
        return {"alertname": name, "severity": severity, "instance": self.instance}

    def start(self) -> None:
        """Say at start what the database open found (called before the loop runs)."""
        reset = self.db.reset_from
        if reset is not None:
            aside, why = reset
            self._reset_at = time.time()
            log.error(
                "state.reset",
                moved_to=str(aside),
                problem=why,
                note="the database could not be read; it was kept aside and state starts "
                "empty: known incidents may be notified again",
            )
            self.detector.ledger.raise_alert(
                Alert(
                    fingerprint=self._fp_reset,
                    labels=self._labels("StateReset", "warning"),
                    starts_at=self._reset_at,
                    annotations={
                        "summary": f"watchd started with empty state: its database was "
                        f"unreadable and was moved to {aside}",
                        "problem": why[:300],
                        "effect": "alerts already sent may be sent again; chat clocks "
                        "restart from the next listing (a lower bound)",
                    },
                ),
                identity="",
            )
        elif self._fp_reset in self.detector.firing:
            self.detector.ledger.clear_alert(self._fp_reset, why="state intact since")

    async def run(self) -> None:
        delay = FLUSH_EVERY
        hurried = self.db.hurried
        while True:
            if delay == FLUSH_EVERY:
                # Within the second, or as soon as an owner hurries (a transition).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await hurried.wait()
                if hurried.is_set():
                    await asyncio.sleep(HURRY_GATHER)  # let the rest of the burst join
            else:
                await asyncio.sleep(delay)  # failing: the backoff's pace, hurried or not
            hurried.clear()
            try:
                if self.db.failing_since is not None and not self.db.pending:
                    await self.db.probe()  # a direct write failed: is writing back?
                await self.db.flush_async()
            except (sqlite3.Error, OSError) as exc:
                delay = self.backoff.next()
                self._failing(exc, retry_in=delay)
                continue
            if self.db.failing_since is not None:
                # A direct write (the notification log) or one owner's rows failed.
                delay = self.backoff.next()
                self._failing(None, retry_in=delay)
                continue
            self.backoff.reset()
            delay = FLUSH_EVERY
            if self._fp_failing in self.detector.firing:
                log.info("state.persisting_again", write_failures=self.db.write_failures)
                self.detector.ledger.clear_alert(self._fp_failing, why="writes succeed again")
            if self._reset_at is not None and time.time() - self._reset_at >= RESET_SHOWN:
                self._reset_at = None
                self.detector.ledger.clear_alert(self._fp_reset, why="an hour since the reset")

    def _failing(self, exc: BaseException | None, *, retry_in: float) -> None:
        error = self.db.last_write_error if exc is None else f"{type(exc).__name__}: {exc}"
        log.error(
            "state.write_failed",
            error=error[:300],
            failures=self.db.write_failures,
            pending=self.db.pending,
            retry_in=round(retry_in, 1),
        )
        if self._fp_failing in self.detector.firing:
            return
        self.detector.ledger.raise_alert(
            Alert(
                fingerprint=self._fp_failing,
                labels=self._labels("StateNotPersisted", "critical"),
                starts_at=self.db.failing_since or time.time(),
                annotations={
                    "summary": f"watchd cannot write its state in {self.state_dir}",
                    "last_error": error[:300],
                    "effect": "watching and alerting go on; a restart now would lose chat "
                    "clocks and pending resolves since the failure began",
                    "hint": "free space on (or fix) the state directory's filesystem",
                },
            ),
            identity="",
        )
