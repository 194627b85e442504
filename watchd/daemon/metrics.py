"""``/metrics`` through prometheus-client: the daemon's registry, with the process and
Python collectors, the histograms of listing, confirmation and notification latency
(observed by hooks), the requests to Coder (told by each identity's transport:
:class:`CoderRequests`), and the live collector (:mod:`watchd.daemon.collector`) whose
counters and gauges are read from the live objects at scrape time.

Every labelled histogram child exists from start-up (at 0), so ``rate()`` and
``increase()`` see the first event. One registry per daemon (never the global
default), so two daemons in one process never share a series. Nothing here reads
a secret.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from watchd.coder import routes
from watchd.daemon.collector import Live

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
from watchd.daemon.families import NON_TERMINAL
from watchd.daemon.view import DaemonView
from watchd.kits.histogram import Buckets

# `_created` gauges per histogram child are noise for scrapers of the 0.0.4 text format.
disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# A listing of a few hundred chats takes tens of ms; 100 000 chats take seconds.
LISTING_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# One GET per due chat, rate-limited per identity: milliseconds to a few seconds.
CONFIRM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# First attempt to acceptance, retries and Retry-After included.
NOTIFY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# One exchange with Coder: a chat GET takes milliseconds, a 500-chat listing page up to
# seconds, the transport's timeout is 30 s.
CODER_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# Time in a non-terminal status: seconds (a quick turn) to a day, so budgets from a
# minute to hours fall on a bucket edge (1m, 2m, 5m, 10m, 15m, 30m, 1h, 2h, 4h, 12h).
STATUS_BUCKETS = (
    5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400,
)  # fmt: skip


class Metrics:
    """The daemon's registry. Hooks observe the histograms; the rest is read at scrape."""

    # The detector's hook, once per transition: a chat left a non-terminal status after
    # ``seconds`` (identity, status, seconds). Durations.observe itself: no call between.
    left_status: Callable[[str, str, float], None]

    def __init__(self, daemon: DaemonView) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.listing = Histogram(
            "watchd_listing_duration_seconds",
            "How long a complete chat listing took, per identity.",
            ["identity"],
            buckets=LISTING_BUCKETS,
            registry=self.registry,
        )
        self.confirmation = Histogram(
            "watchd_confirmation_duration_seconds",
            "How long a confirmation read (GET of a due chat) took, per identity.",
            ["identity"],
            buckets=CONFIRM_BUCKETS,
            registry=self.registry,
        )
        self.notification = Histogram(
            "watchd_notification_duration_seconds",
            "From a notification's first attempt to its acceptance, per receiver.",
            ["receiver"],
            buckets=NOTIFY_BUCKETS,
            registry=self.registry,
        )
        # Observed on every transition of the watch path: counted here (a bisect and two
        # increments), rendered at scrape; prometheus_client's labels().observe() was a
        # third of an event's cost.
        self.status_duration = Durations()
        self.left_status = self.status_duration.observe
        self.coder = CoderRequests(self.registry)
        self.registry.register(Live(daemon))
        self.registry.register(_DurationsCollector(self.status_duration))

    def identity_added(self, name: str) -> None:
        self.listing.labels(name)
        self.confirmation.labels(name)
        self.coder.wait.labels(name)
        self.status_duration.add(name)

    def identity_removed(self, name: str) -> None:
        for h in (self.listing, self.confirmation, self.coder.wait):
            with contextlib.suppress(KeyError):
                h.remove(name)
        self.status_duration.remove(name)

    def delivered(self, receiver: str, seconds: float) -> None:
        """The dispatcher's hook: a notification accepted ``seconds`` after its first try."""
        self.notification.labels(receiver).observe(seconds)

    def receivers(self, names: list[str]) -> None:
        for name in names:
            self.notification.labels(name)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class Durations:
    """``watchd_chat_status_duration_seconds``: per identity and non-terminal status, a
    :class:`~watchd.kits.histogram.Buckets` of STATUS_BUCKETS (an unknown status is ``other``)."""

    def __init__(self) -> None:
        self._by: dict[tuple[str, str], Buckets] = {}

    def add(self, identity: str) -> None:
        for status in NON_TERMINAL:
            self._by.setdefault((identity, status), Buckets(STATUS_BUCKETS))

    def remove(self, identity: str) -> None:
        for status in NON_TERMINAL:
            self._by.pop((identity, status), None)

    def observe(self, identity: str, status: str, seconds: float) -> None:
        h = self._by.get((identity, status))
        if h is None:
            if status not in NON_TERMINAL:
                status = "other"
            h = self._by.setdefault((identity, status), Buckets(STATUS_BUCKETS))
        h.observe(seconds)

    def family(self) -> HistogramMetricFamily:
        h = HistogramMetricFamily(
            "watchd_chat_status_duration_seconds",
            "Time a chat spent in a non-terminal status, observed when it left it "
            "(server clock; a lower bound for a chat first seen in a listing).",
            labels=["identity", "status"],
        )
        for (identity, status), counts in sorted(self._by.items()):
            h.add_metric([identity, status], counts.samples(), sum_value=counts.sum)
        return h


class _DurationsCollector(Collector):
    def __init__(self, durations: Durations) -> None:
        self.durations = durations

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        yield self.durations.family()


class CoderRequests:
    """Every request to Coder, as each identity's transport tells it (its Meter): by
    method, route template and answer class, summed over identities (so the series stay
    a few hundred however many identities); the limiter's waits per identity. Labels come
    from coder.routes' bounded sets: never a chat id, a workspace id or a query."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "watchd_coder_requests_total",
            "Requests to Coder by method, route template and answer class (2xx, 3xx, 4xx, "
            "429, 5xx; error: no answer), retries each counted.",
            ["method", "path", "status"],
            registry=registry,
        )
        self.duration = Histogram(
            "watchd_coder_request_duration_seconds",
            "Requests to Coder from sending to the body read (the rate limiter's wait "
            "excluded), by method and route template.",
            ["method", "path"],
            buckets=CODER_BUCKETS,
            registry=registry,
        )
        self.wait = Counter(
            "watchd_coder_ratelimit_wait_seconds_total",
            "Time requests waited for their identity's rate limiter (requests_per_minute).",
            ["identity"],
            registry=registry,
        )
        self.stale_connections = Counter(
            "watchd_coder_stale_connections_total",
            "Requests to Coder that met a pooled connection the server had closed and were "
            "sent again once on a fresh one (GETs only; not an outage).",
            ["identity"],
            registry=registry,
        )
        for method, path in routes.ROUTES:
            self.duration.labels(method, path)
            for status in routes.STATUSES:
                self.requests.labels(method, path, status)

    def request(self, method: str, path: str, status: int | None, seconds: float) -> None:
        m, route = routes.method(method), routes.template(path)
        self.requests.labels(m, route, routes.status_class(status)).inc()
        self.duration.labels(m, route).observe(seconds)

    def waited(self, identity: str, seconds: float) -> None:
        self.wait.labels(identity).inc(seconds)

    def stale(self, identity: str) -> None:
        self.stale_connections.labels(identity).inc()
