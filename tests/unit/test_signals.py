"""SLO signals and the agents' transport events as metrics (fleet.md §5)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from tests.unit.test_detector import rig
from watchd.config.loading import parse_config
from watchd.config.secrets import resolve_secrets
from watchd.config.watching import Budgets
from watchd.daemon.app import Daemon
from watchd.kits.clock import ServerClock
from watchd.store.health import IdentityHealth
from watchd.telemetry.agents import AgentSignals
from watchd.telemetry.events import EventSource, own_source
from watchd.telemetry.pipeline import SpanPipeline
from watchd.telemetry.spans import SpanConverter

AGENT = EventSource("agent-svc", "pod-1", "a1")


def test_settled_segments_count_by_outcome_and_time_by_duration() -> None:
    """A settle with status and finishReason is clean, with error is error, with neither
    teardown; durationMs lands in its bucket (seconds), a settle without it is counted
    but not timed; redials and HTTP classes are counted, a non-numeric status as error."""
    a = AgentSignals()
    for ev in (
        {"type": "segment:settle", "status": "ok", "finishReason": "stop", "durationMs": 1200},
        {"type": "segment:settle", "error": {"message": "boom"}, "durationMs": 90_000},
        {"type": "segment:settle"},
        {"type": "ws:redial"},
        {"type": "ws:redial"},
        {"type": "http:response", "status": 200},
        {"type": "http:response", "status": 503},
        {"type": "http:response", "status": "weird"},
        {"type": "http:error", "message": "reset"},
        {"type": "ws:open"},
    ):
        a.observe(ev)
    snap = a.snapshot()
    assert snap["segments"] == {"clean": 1, "error": 1, "teardown": 1}
    h = snap["segment_seconds"]
    assert h["counts"][h["buckets"].index(2.5)] == 1  # 1.2 s
    assert h["counts"][h["buckets"].index(60.0)] == 1 and h["counts"][-1] == 2  # 90 s: 120
    assert h["sum"] == 91.2
    assert snap["redials"] == 2
    assert snap["http"] == {"1xx": 0, "2xx": 1, "3xx": 0, "4xx": 0, "5xx": 1, "error": 2}


async def test_the_pipeline_counts_agents_events_never_watchds_own() -> None:
    """Forwarded events reach the agent signals; watchd's own traffic (own_source) does
    not, though both become spans."""
    p = SpanPipeline(converter=SpanConverter(), export=None)
    p.sink.emit(AGENT, {"type": "ws:redial", "timestamp": 1, "chatId": "c", "attempt": 2})
    p.sink.emit(own_source("team-a"), {"type": "ws:redial", "timestamp": 1, "attempt": 2})
    assert p.drain() == 2
    assert p.snapshot()["agents"]["redials"] == 1


@pytest.mark.looptime
async def test_the_status_histogram_observes_leaving_a_status_on_the_server_clock() -> None:
    """pending 40 s then running 300 s then waiting: two observations, each its status's
    dwell between the server's stamps; entering waiting (terminal) observes nothing."""
    left: list[tuple[str, str, float]] = []
    async with rig(Budgets(running=3600, pending=3600)) as r:
        r.det.on_left = lambda i, s, t: left.append((i, s, t))
        r.ready()
        t0 = r.clock.now()
        r.see("c1", "pending", t0)
        r.advance(40)
        r.see("c1", "running", t0 + 40)
        r.advance(300)
        r.see("c1", "waiting", t0 + 340)
        await asyncio.sleep(0)
    assert left == [("a", "pending", 40.0), ("a", "running", 300.0)]


async def test_slo_and_agent_series_in_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/metrics has the status-duration histogram per identity and non-terminal status
    (at 0 from the start), the oldest-age gauge from the store (0 with no chat), and the
    agent series; no chat id appears as a label value."""
    monkeypatch.setenv("WATCHD_TEST_TOKEN", "token-value-0123456789")
    config = parse_config(
        {
            "identities": [
                {"name": "team-a", "url": "https://coder.test", "token_env": "WATCHD_TEST_TOKEN"}
            ],
            "state_dir": str(tmp_path),
            "telemetry": {"exporter": "none"},
        }
    )
    d = Daemon(config, resolve_secrets(config))
    try:
        clock = ServerClock()
        d.health["team-a"] = IdentityHealth(
            name="team-a", deployment="https://coder.test", server_clock=clock, unhealthy_after=60
        )
        d.metrics.identity_added("team-a")
        from watchd.coder.observing import ChatId, Observation

        now = clock.now()
        d.store.observe(
            "team-a",
            Observation(id=ChatId("chat-1"), status="running", updated_at=now - 700),
            now=now - 700,
            via="watch",
            kind="status_change",
        )
        d.metrics.left_status("team-a", "pending", 42.0)
        text = d.metrics.render().decode()
        assert (
            'watchd_chat_status_duration_seconds_count{identity="team-a",status="pending"} 1.0'
            in text
        )
        bucket = 'watchd_chat_status_duration_seconds_bucket{identity="team-a",le="60.0"'
        assert f'{bucket},status="pending"}} 1.0' in text
        assert (
            'watchd_chat_status_duration_seconds_count{identity="team-a",status="running"} 0.0'
            in text
        )
        oldest = 'watchd_chat_oldest_status_age_seconds{identity="team-a",status="running"}'
        line = next(ln for ln in text.splitlines() if ln.startswith(oldest))
        assert 699 <= float(line.split()[-1]) <= 705
        assert (
            'watchd_chat_oldest_status_age_seconds{identity="team-a",status="pending"} 0.0' in text
        )
        assert 'watchd_agent_segments_total{outcome="clean"} 0.0' in text
        assert "watchd_agent_redials_total 0.0" in text
        assert 'watchd_agent_http_responses_total{code_class="5xx"} 0.0' in text
        assert 'watchd_agent_segment_duration_seconds_bucket{le="+Inf"} 0.0' in text
        assert "chat-1" not in text
        assert re.search(r'watchd_build_info\{[^}]*revision="([0-9a-f]{7,}|unknown)"', text)
    finally:
        d.db.close()
