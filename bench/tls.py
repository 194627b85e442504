"""Idle CPU over TLS, as production Coder is HTTPS, against the same case over plain HTTP
in the same run; and how many connections (each a TLS handshake) a reconcile opens."""

from __future__ import annotations

import time
from typing import Any

from bench.cases import Row, row
from bench.procs import Daemon, Sim, wait_for


def _listings(sim: Sim) -> int:
    """Listing requests the simulator answered, over every user."""
    by_user: dict[str, dict[str, dict[str, int]]] = sim.admin("GET", "/state")["requests_by_user"]
    return sum(sum(kinds.get("list", {}).values()) for kinds in by_user.values())


def _idle(daemon: Daemon, sim: Sim, window: float) -> tuple[float, float]:
    """(idle CPU in % of a core, new connections per listing) over ``window`` seconds."""
    cpu, conns, lists = daemon.cpu, sim.admin("GET", "/connections")["connections"], _listings(sim)
    time.sleep(window)
    idle = (daemon.cpu - cpu) / window * 100
    opened = sim.admin("GET", "/connections")["connections"] - conns
    return idle, opened / max(1, _listings(sim) - lists)


def tls_idle(users: int, per_user: int, idle_window: float) -> list[Row]:
    """The 60 s-reconcile idle case of ``cases.scale`` twice at once: over TLS (the
    simulator's generated CA as each identity's ca_file) and over plain HTTP."""
    chats = users * per_user
    bulk: list[str] = ["--scenario", "bulk", "--users", str(users)]
    bulk += ["--chats-per-user", str(per_user)]
    plain, tls = Sim(*bulk), Sim(*bulk, "--tls")
    extra: dict[str, Any] = {"reconcile_interval": "60s"}
    try:
        d_plain, d_tls = Daemon(plain, extra=extra), Daemon(tls, extra=extra)
        wait_for(d_plain.ready, within=600, step=0.1)
        wait_for(d_tls.ready, within=600, step=0.1)
        time.sleep(5)  # the seed's connections settle into the pool
        c_plain, c_tls = d_plain.cpu, d_tls.cpu
        idle_tls, per_listing = _idle(d_tls, tls, idle_window)
        idle_plain = (d_plain.cpu - c_plain) / idle_window * 100
        seed_tls = c_tls
        d_plain.stop()
        d_tls.stop()
    finally:
        plain.stop()
        tls.stop()
    return [
        row(
            f"idle CPU over {idle_window:.0f}s over TLS ({chats} chats, reconcile 60s)",
            idle_tls,
            "% of a core",
            idle_plain,
            "the same daemon and case over plain HTTP",
            "< 1.5 %",
        ),
        row(
            "new connections (TLS handshakes) per reconcile listing",
            per_listing,
            "connections",
            None,
            "",
            "0 (the pooled connection kept past the reconcile interval)",
        ),
        row(f"seed {chats} chats over TLS: daemon CPU", seed_tls, "cpu-s", None, ""),
    ]
