"""/metrics through prometheus-client, checked by promtool: process and Python collectors,
build info, latency histograms, and every labelled series present from start-up."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from collections.abc import Callable

import pytest

from tests.e2e.harness import DaemonProcess, SimProcess, eventually

StartSim = Callable[..., SimProcess]
StartDaemon = Callable[..., DaemonProcess]


def value(text: str, series: str) -> float | None:
    """The sample of one exact series line (name plus sorted labels as exposed)."""
    m = re.search(rf"^{re.escape(series)} (\S+)$", text, flags=re.MULTILINE)
    return float(m.group(1)) if m else None


async def scrape(d: DaemonProcess) -> str:
    status, text = await d.get("/metrics")
    assert status == 200
    return str(text)


async def test_metrics_pass_promtool_and_exist_from_start_up(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """Before anything happened: promtool-clean, collectors and build info present, and
    each identity/receiver series already exported at 0."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool missing: tests/setup/system-deps installs it (root and apt)")
    sim = start_sim()
    d = start_daemon(sim)
    await d.wait_ready()
    text = await scrape(d)
    r = await asyncio.to_thread(
        subprocess.run,
        [promtool, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr
    for family in ("process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"):
        assert f"# TYPE {family} " in text
    assert "python_gc_objects_collected_total" in text
    assert re.search(r'^watchd_build_info\{[^}]*version="0\.1\.0"[^}]*\} 1\.0$', text, re.M)
    for series in (
        'watchd_chats{identity="team-a",status="running"}',
        'watchd_chats{identity="team-a",status="requires_action"}',
        'watchd_alerts_firing{alertname="ChatStuck",identity="team-a"}',
        'watchd_alerts_firing{alertname="IdentityUnhealthy",identity="team-a"}',
        'watchd_notifications_total{outcome="failed",receiver="console"}',
        'watchd_notifications_total{outcome="sent",receiver="console"}',
        'watchd_confirmation_duration_seconds_count{identity="team-a"}',
        'watchd_notification_duration_seconds_count{receiver="console"}',
    ):
        assert value(text, series) == 0.0, series
    assert (value(text, 'watchd_listing_duration_seconds_count{identity="team-a"}') or 0) >= 1


async def test_latency_histograms_observe_confirmations_and_notifications(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """A stuck chat's confirmation read and its notification land in the histograms."""
    sim = start_sim()
    d = start_daemon(sim, extra={"route": {"receiver": "console", "group_wait": "0s"}})
    await d.wait_ready()
    await sim.add_chat("alice", status="running")
    await eventually(lambda: d.firing("ChatStuck"), within=15)

    async def observed() -> bool:
        text = await scrape(d)
        confirm = value(text, 'watchd_confirmation_duration_seconds_count{identity="team-a"}')
        sent = value(text, 'watchd_notification_duration_seconds_count{receiver="console"}')
        return bool(confirm and sent)

    await eventually(observed, within=15)
    text = await scrape(d)
    assert value(text, 'watchd_alerts_firing{alertname="ChatStuck",identity="team-a"}') == 1.0


async def test_requests_to_coder_are_counted_by_route_template_never_by_chat_id(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """The daemon's listings and a stuck chat's confirmation read are counted and timed
    under their route templates, each identity's limiter wait is exported from the
    start, and the chat's id is nowhere on /metrics."""
    sim = start_sim()
    d = start_daemon(sim)
    await d.wait_ready()
    chat = await sim.add_chat("alice", status="running")
    await eventually(lambda: d.firing("ChatStuck"), within=15)
    text = await scrape(d)
    listing = 'method="GET",path="/api/v2/chats",status="2xx"'
    single = 'method="GET",path="/api/v2/chats/{chat}",status="2xx"'
    assert (value(text, f"watchd_coder_requests_total{{{listing}}}") or 0) >= 1
    assert (value(text, f"watchd_coder_requests_total{{{single}}}") or 0) >= 1
    assert value(text, "watchd_coder_requests_total{" + listing.replace("2xx", "429") + "}") == 0
    timed = 'watchd_coder_request_duration_seconds_count{method="GET",path="/api/v2/chats/{chat}"}'
    assert (value(text, timed) or 0) >= 1
    assert value(text, 'watchd_coder_ratelimit_wait_seconds_total{identity="team-a"}') == 0.0
    assert chat not in text
