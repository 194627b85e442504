"""One chat's story end to end: the real daemon, the simulator, forwarded agent events;
its timeline (JSON, and the page in headless Chromium: test-artifacts/timeline.png), the
SLO histogram and gauge, and the agent metrics, all from what really happened."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from tests.e2e import browser
from tests.e2e.harness import DaemonProcess, SimProcess, eventually

StartSim = Callable[..., SimProcess]
StartDaemon = Callable[..., DaemonProcess]


def at(entry: dict[str, Any]) -> float:
    return datetime.fromisoformat(entry["at"]).timestamp()


def metric(text: str, name: str, **labels: str) -> float:
    """The sample of ``name`` whose labels include ``labels`` (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ", 1)[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def redial(chat: str, timestamp: int, *, attempt: int) -> dict[str, Any]:
    return {
        "type": "ws:redial",
        "timestamp": timestamp,
        "chatId": chat,
        "attempt": attempt,
        "consecutiveFailures": attempt - 1,
        "maxConsecutiveFailures": 8,
        "backoffMs": 100 * attempt,
    }


async def forward(d: DaemonProcess, events: list[dict[str, Any]]) -> None:
    body = {"source": {"service": "agent", "instance": "pod-1"}, "events": events}
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://{d.listen}/v1/transport-events", json=body) as r,
    ):
        assert r.status == 202, await r.text()


async def test_a_chats_timeline_slo_signals_and_agent_metrics(
    tmp_path: Path, start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """requires_action → running → stuck (ChatStuck) → waiting without a stream event (found by
    the reconcile) → resolved, with agent events for it and for another chat: the timeline
    holds exactly this chat's story, in order, with the right sources; the histogram's
    count and sum are the dwell times between the timeline's stamps; the oldest-age gauge
    tracks the other chat, left running; the agent metrics are what was forwarded."""
    sim = start_sim()
    d = start_daemon(
        sim,
        extra={
            "budgets": {"running": "4s", "requires_action": "1h"},
            "server": {"external_url": "https://watchd.example.com"},
        },
    )  # fmt: skip
    await d.wait_ready()
    other = await sim.add_chat("alice", status="running", title="left running")
    chat = await sim.add_chat("alice", status="requires_action", title="the one on call asks about")
    await asyncio.sleep(1.0)
    await sim.set_status(chat, "running")
    now_ms = int(time.time() * 1000)
    ours = [
        {"type": "ws:dial", "timestamp": now_ms, "chatId": chat, "attempt": 1, "url": "wss://x"},
        redial(chat, now_ms + 10, attempt=2),
        redial(chat, now_ms + 20, attempt=3),
        {"type": "ws:open", "timestamp": now_ms + 30, "chatId": chat, "attempt": 3},
        {
            "type": "http:response", "timestamp": now_ms + 40, "id": "1", "method": "GET",
            "path": f"/api/v2/chats/{chat}", "status": 200, "durationMs": 12,
        },
        {
            "type": "segment:settle", "timestamp": now_ms + 50, "segment": 1, "chatId": chat,
            "status": "waiting", "finishReason": "stop", "durationMs": 1500,
        },
    ]  # fmt: skip
    theirs = [redial(other, now_ms + 5, attempt=2)]
    await forward(d, ours + theirs)
    await eventually(lambda: _firing_for(d, chat), within=20)
    await sim.set_status(chat, "waiting", silent=True)  # the stream never says so
    await eventually(lambda: _resolved_for(d, chat), within=20)

    status, doc = await d.get(f"/status/chats/{chat}")
    assert status == 200, doc
    entries = doc["entries"]
    assert [at(e) for e in entries] == sorted(at(e) for e in entries)
    story = [(e["source"], e["what"].split(" (")[0].split(":")[0]) for e in entries]
    kinds = [s for s, _ in story]
    assert story[0] == ("stream", "created")
    assert ("stream", "requires_action → running") in story
    assert kinds.count("transport") == len(ours)
    fired = next(i for i, e in enumerate(entries) if e["what"].startswith("ChatStuck fired"))
    waiting = next(i for i, e in enumerate(entries) if "→ waiting" in e["what"])
    resolved = next(i for i, e in enumerate(entries) if e["what"].startswith("ChatStuck resolved"))
    # The listing's stamp of waiting is the row's updated_at, which may tie with (or, at
    # a second's resolution, precede) the moment the chat went past its budget: entries
    # are in server-time order, so only "before the resolve" is certain for both.
    assert fired < resolved and waiting < resolved and resolved == len(entries) - 1
    assert entries[waiting]["source"] == "listing" and entries[fired]["source"] == "alert"
    assert entries[fired + 1]["source"] == "diagnosis"
    assert not any(other in e["what"] for e in entries)
    assert doc["verdict"] == [] and doc["status"] == "waiting"
    alert = next(a for a in d_history(await d.status(), chat))
    assert alert["annotations"]["timeline"] == f"https://watchd.example.com/status/chats/{chat}"
    status, _ = await d.get("/status/chats/no-such-chat")
    assert status == 404

    # The SLO signals: the dwell between the timeline's own stamps, on the server clock.
    t_paused = at(entries[0])
    t_running = at(next(e for e in entries if e["what"] == "requires_action → running"))
    t_waiting = at(entries[waiting])
    _, text = await d.get("/metrics")
    assert metric(text, "watchd_chat_status_duration_seconds_count", status="requires_action") == 1
    assert metric(text, "watchd_chat_status_duration_seconds_count", status="running") == 1
    paused_sum = metric(text, "watchd_chat_status_duration_seconds_sum", status="requires_action")
    running_sum = metric(text, "watchd_chat_status_duration_seconds_sum", status="running")
    assert abs(paused_sum - (t_running - t_paused)) < 1e-3
    assert abs(running_sum - (t_waiting - t_running)) < 1e-3
    first = metric(text, "watchd_chat_oldest_status_age_seconds", status="running")
    await asyncio.sleep(2.0)
    _, text = await d.get("/metrics")
    later = metric(text, "watchd_chat_oldest_status_age_seconds", status="running")
    assert first > 3 and 1.5 <= later - first <= 3.5, (first, later)
    # The agents' metrics: what was forwarded, not watchd's own traffic.
    assert metric(text, "watchd_agent_redials_total") == 3
    assert metric(text, "watchd_agent_segments_total", outcome="clean") == 1
    assert metric(text, "watchd_agent_http_responses_total", code_class="2xx") == 1
    assert metric(text, "watchd_agent_segment_duration_seconds_sum") == 1.5

    # The page on-call opens from the alert, in headless Chromium.
    url = f"http://{d.listen}/status/chats/{chat}?format=html"
    page = await browser.dom(tmp_path, url)
    assert "No alert is firing for this chat." in page and "the one on call asks about" in page
    assert page.count('<li class="transport">') == len(ours)
    assert page.index("requires_action → running") < page.index("ChatStuck fired")
    assert sim.token("alice") not in page
    status_page = await browser.dom(tmp_path, f"http://{d.listen}/status?format=html")
    assert f"/status/chats/{other}?format=html" in status_page or other in status_page
    await browser.screenshot(tmp_path, url, "timeline.png", size="412,915")
    assert json.dumps(doc).count(sim.token("alice")) == 0


async def _firing_for(d: DaemonProcess, chat: str) -> bool:
    return any(a["labels"].get("chat_id") == chat for a in await d.firing("ChatStuck"))


async def _resolved_for(d: DaemonProcess, chat: str) -> bool:
    return any(True for _ in d_history(await d.status(), chat, resolved=True))


def d_history(doc: dict[str, Any], chat: str, *, resolved: bool = False) -> Any:
    for a in doc["alerts"].get("resolved", []):
        if a["labels"].get("chat_id") == chat:
            yield a
    if not resolved:
        for a in doc["alerts"]["firing"]:
            if a["labels"].get("chat_id") == chat:
                yield a
