"""The live collector behind ``/metrics``: families computed on every scrape from the
daemon's snapshot (:class:`~watchd.daemon.snapshot.Snapshot`: identity health among
the rest) and the firing alerts (through :class:`~watchd.daemon.view.DaemonView`), so
there is no second copy of any number to drift.

Every labelled series exists from start-up (at 0): per identity for each known
status and alert name, per receiver for each outcome, per guarded task kind, so
``rate()`` and ``increase()`` see the first event. Label spaces stay bounded (an
unknown status is one ``other`` series). It registers nothing itself and reads no
secret; :mod:`watchd.daemon.metrics` owns the registry.
"""

from __future__ import annotations

import math
import platform
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import InfoMetricFamily
from prometheus_client.registry import Collector

from watchd.buildinfo import revision
from watchd.daemon.families import (
    chat_families,
    counter,
    dispatch_families,
    gauge,
    per_identity,
    single,
    state_families,
    telemetry_families,
)
from watchd.daemon.snapshot import Snapshot
from watchd.daemon.view import DaemonView
from watchd.detection.alerts import SEVERITY

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

ALERT_NAMES = sorted({*SEVERITY, "QuotaLow", "ChatSwept"})


class Live(Collector):
    """Families computed from the live objects on every scrape: no second copy to drift."""

    def __init__(self, daemon: DaemonView) -> None:
        self.d = daemon

    def describe(self) -> Iterator[Metric]:
        return iter(())  # families depend on the config; collected fresh each scrape

    def collect(self) -> Iterator[Metric]:
        d = self.d
        snap = d.snapshot()
        info = InfoMetricFamily("watchd_build", "watchd's version and runtime.")
        info.add_metric(
            [],
            {
                "version": d.version,
                "revision": revision(),
                "python_version": platform.python_version(),
                "implementation": platform.python_implementation(),
            },
        )
        yield info
        yield from self._sharding()
        yield from chat_families(snap)
        yield from state_families(snap)
        yield from self._identities(snap)
        yield from self._activity(snap)
        yield from self._incidents()
        yield from _quota(snap)
        yield from _forecast(snap)
        if snap.sweep is not None:
            sweep = counter(
                "watchd_sweep_total",
                "Sweep decisions and actions by outcome.",
                ["outcome", "dry_run"],
            )
            for k, v in sorted(snap.sweep.counts.items()):
                sweep.add_metric([k, str(snap.sweep.dry_run).lower()], v)
            yield sweep
        yield from telemetry_families(snap.telemetry)
        if snap.dispatch is not None:
            yield from dispatch_families(snap.dispatch)

    def _identities(self, snap: Snapshot) -> Iterator[Metric]:
        """Alerts firing per identity and alert name, and each identity's watch."""
        d = self.d
        ident = list(snap.health.items())
        firing = Counter((a.labels.get("identity", ""), a.name) for a in d.detector.firing.values())
        alerts = gauge(
            "watchd_alerts_firing",
            "Alerts firing, by identity and alert name.",
            ["identity", "alertname"],
        )
        keys = {(i, n) for i, _ in ident for n in ALERT_NAMES} | firing.keys()
        for i, n in sorted(keys):
            alerts.add_metric([i, n], firing.get((i, n), 0))
        yield alerts

        yield per_identity(
            gauge("watchd_identity_ready", "1 when the identity is seeded and streaming."),
            ident,
            lambda h: 1.0 if h.ready else 0.0,
        )
        yield per_identity(
            counter("watchd_watch_reconnects_total", "Watch stream redials."),
            ident,
            lambda h: h.reconnects,
        )
        yield per_identity(
            counter("watchd_relists_total", "Complete listings applied."),
            ident,
            lambda h: h.relists,
        )
        yield per_identity(
            counter("watchd_watch_events_total", "Watch events applied."),
            ident,
            lambda h: h.events,
        )
        # No sample before the first listing: an age of 0 would claim a fresh one.
        age = gauge(
            "watchd_last_list_age_seconds",
            "Age of the last complete listing (absent until the first).",
            ["identity"],
        )
        for n, h in ident:
            if h.last_list_ok is not None:
                age.add_metric([n], round(h.server_now - h.last_list_ok, 3))
        yield age

    def _activity(self, snap: Snapshot) -> Iterator[Metric]:
        """The store's and the detector's counters, reloads and writes pending."""
        yield single(
            counter(
                "watchd_synthesized_transitions_total",
                "Transitions found by a listing that the stream never delivered.",
                [],
            ),
            snap.store.synthesized,
        )
        det = counter("watchd_detector_events_total", "Detector activity by kind.", ["kind"])
        for k, v in sorted(self.d.detector.counters.items()):
            det.add_metric([k], v)
        yield det
        yield single(gauge("watchd_timers", "Armed chat clocks.", []), len(self.d.detector.timers))
        yield single(
            counter("watchd_store_overflow_total", "Chats not stored: store at capacity.", []),
            snap.store.overflow,
        )
        reloads = counter(
            "watchd_config_reloads_total",
            "Reloads (SIGHUP, POST /-/reload) by outcome: applied, rejected (invalid file), "
            "failed (applying it failed).",
            ["outcome"],
        )
        for k, v in sorted(snap.reloads.items()):
            reloads.add_metric([k], v)
        yield reloads
        # Prometheus' and Alertmanager's names, so their dashboards and rules carry over.
        yield single(
            gauge(
                "watchd_config_last_reload_successful",
                "1 when the last reload (or the start-up load) succeeded.",
                [],
            ),
            1.0 if snap.reload_successful else 0.0,
        )
        yield single(
            gauge(
                "watchd_config_last_reload_success_timestamp_seconds",
                "When a reload (or the start-up load) last succeeded.",
                [],
            ),
            round(snap.reload_success_at, 3),
        )
        yield single(
            gauge("watchd_state_pending_writes", "Chat records not yet flushed to disk.", []),
            snap.state.pending,
        )

    def _incidents(self) -> Iterator[Metric]:
        """Member count of each firing FleetIncident (absent otherwise): deployments are
        configured and causes a closed vocabulary, so the label space stays bounded."""
        fleet = gauge(
            "watchd_fleet_incidents",
            "Member chat alerts of each firing FleetIncident.",
            ["deployment", "cause"],
        )
        for inc in sorted(
            self.d.detector.ledger.incidents.firing(), key=lambda i: (i.deployment, i.cause)
        ):
            fleet.add_metric([inc.deployment, inc.cause], len(inc.members))
        yield fleet

    def _sharding(self) -> Iterator[Metric]:
        d = self.d
        sh = d.config.sharding
        shard = InfoMetricFamily("watchd_shard", "This replica's place among its peers.")
        shard.add_metric(
            [],
            {
                "replica": str(d.shard_index),
                "replicas": str(sh.replicas),
                "replication_factor": str(sh.replication_factor),
            },
        )
        yield shard
        owned = gauge("watchd_identities_owned", "Identities this replica watches.")
        owned.add_metric([], float(len(d.health)))
        yield owned
        # Bounded by the identities in the config times the replication factor.
        owner = gauge(
            "watchd_identity_owner",
            "1 for each (identity, replica) that owns it, as every replica computes it.",
            ["identity", "replica"],
        )
        watched = gauge(
            "watchd_identity_watched",
            "1 for each configured identity this replica watches, else 0 (alerts/: more or "
            "fewer replicas than its owners watching one is an overlap or a gap).",
        )
        for name, reps in sorted(d.config.identity_owners().items()):
            for r in reps:
                owner.add_metric([name, str(r)], 1.0)
            watched.add_metric([name], 1.0 if name in d.health else 0.0)
        yield owner
        yield watched


def _quota(snap: Snapshot) -> Iterator[Metric]:
    quota = [
        (n, h.quota)
        for n, h in snap.health.items()
        if h.quota is not None and not h.quota.unlimited
    ]
    headroom = gauge(
        "watchd_quota_headroom_credits", "Workspace quota budget minus consumed.", ["identity"]
    )
    budget = gauge("watchd_quota_budget_credits", "Workspace quota budget.", ["identity"])
    for n, q in quota:
        headroom.add_metric([n], float(q.headroom or 0))
        budget.add_metric([n], float(q.budget))
    yield headroom
    yield budget


def _forecast(snap: Snapshot) -> Iterator[Metric]:
    """Per identity: the fitted rate, and the seconds until the line reaches the budget
    (+Inf while it does not rise; both absent before the first reading)."""
    rate = gauge("watchd_quota_consumption_rate", "Quota use, credits/h.", ["identity"])
    eta = gauge("watchd_quota_exhaustion_eta_seconds", "Quota projected out in.", ["identity"])
    for n, h in sorted(snap.health.items()):
        if (out := h.forecast) is not None:
            if out.rate_per_hour is not None:
                rate.add_metric([n], out.rate_per_hour)
            left = math.inf if out.eta is None else max(0.0, out.eta - h.server_now)
            eta.add_metric([n], left)
    yield rate
    yield eta
