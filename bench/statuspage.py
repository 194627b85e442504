"""The status page at scale: ``n`` firing alerts held by an in-process daemon.

Measures the /status JSON document (size, build time, the longest the event loop went
without a turn while building it), the HTML page (size) and Chromium's time to load and
render it, against an empty page loaded the same way (the baseline); and /healthz p99 over
the daemon's own HTTP server while /status is requested back to back, against /healthz
from the same server with no render (issue 18's target: < 50 ms).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.cases import Row, row


def status_page(n: int) -> list[Row]:
    return asyncio.run(_status_page(n))


async def _status_page(n: int) -> list[Row]:
    from watchd.alerting.model import Alert
    from watchd.config.loading import parse_config
    from watchd.config.secrets import resolve_secrets
    from watchd.daemon import status, status_page
    from watchd.daemon.app import Daemon
    from watchd.kits.clock import ServerClock
    from watchd.store.health import IdentityHealth

    tmp = Path(tempfile.mkdtemp(prefix="watchd-bench-status-"))
    os.environ.setdefault("WATCHD_BENCH_TOKEN", "bench-token-0123456789")
    url = "https://coder.example.com"
    config = parse_config(
        {
            "identities": [
                {"name": f"team-{k}", "url": url, "token_env": "WATCHD_BENCH_TOKEN"} for k in "ab"
            ],
            "state_dir": str(tmp),
            "telemetry": {"exporter": "none"},
            "server": {"listen": "127.0.0.1:0"},
        }
    )
    d = Daemon(config, resolve_secrets(config))
    for k in "ab":
        d.health[f"team-{k}"] = IdentityHealth(
            name=f"team-{k}", deployment=url, server_clock=ServerClock(), unhealthy_after=60
        )
    now = time.time()
    for i in range(n):
        chat = f"chat-{i:06d}"
        d.detector.firing[f"fp{i}"] = Alert(
            fingerprint=f"fp{i}",
            labels={
                "alertname": "ChatStuck",
                "identity": "team-a" if i % 2 else "team-b",
                "status": "running",
                "chat_id": chat,
                "owner": "user",
                "deployment": url,
                "severity": "warning",
            },
            annotations={
                "summary": f'Chat "turn {i}" has been running for 40m (budget 30m)',
                "title": f"turn {i}",
                "time_in_status": "40m",
                "time_in_status_seconds": "2400",
                "budget": "30m",
                "link": f"{url}/agents/{chat}",
                "hint": "deployment concurrency cap reached",
                "clock": "status",
            },
            starts_at=now - 100,
        )
    gaps: list[float] = []
    done = False

    async def ticker() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            t = time.perf_counter()
            gaps.append(t - last)
            last = t

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    doc = await status.status_document(d)
    body = orjson.dumps(doc, option=orjson.OPT_INDENT_2)  # as the server encodes it
    built = time.perf_counter() - t0
    done = True
    await task
    page = status_page.status_html(
        await status.status_document(d, status.StatusQuery(limit=status.HTML_PAGE))
    )
    healthz = await _healthz_during_renders(d)
    d.db.close()
    rows = [
        row(f"status JSON at {n} alerts: size", len(body) / 1e6, "MB", target="paginated"),
        row(f"status JSON at {n} alerts: build", built * 1000, "ms"),
        row(f"status JSON at {n} alerts: longest loop stall", max(gaps) * 1000, "ms"),
        row(f"status HTML at {n} alerts: size", len(page.encode()) / 1e6, "MB", target="≤ 1"),
        row(
            f"/healthz p99 during {n}-alert /status renders",
            _p99(healthz["busy"]) * 1000,
            "ms",
            baseline=_p99(healthz["quiet"]) * 1000,
            baseline_name="/healthz p99, same server, no render",
            target="< 50 ms",
        ),
        row(
            f"/healthz max during {n}-alert /status renders",
            max(healthz["busy"]) * 1000,
            "ms",
            baseline=max(healthz["quiet"]) * 1000,
            baseline_name="/healthz max, same server, no render",
        ),
        row(
            f"/status request at {n} alerts, median (JSON and HTML, over HTTP)",
            sorted(healthz["renders"])[len(healthz["renders"]) // 2] * 1000,
            "ms",
        ),
    ]
    chromium = shutil.which("chromium")
    if chromium:
        html_file = tmp / "status.html"
        html_file.write_text(page)
        blank = tmp / "blank.html"
        blank.write_text("<!doctype html><title>x</title><p>x</p>")
        _chromium(chromium, blank, tmp)  # the first start creates the profile: not counted
        rows.append(
            row(
                f"status HTML at {n} alerts: Chromium load+render",
                _chromium(chromium, html_file, tmp),
                "s",
                baseline=_chromium(chromium, blank, tmp),
                baseline_name="an empty page",
                target="≤ 1 s above baseline",
            )
        )
    return rows


# Runs in a separate process, so its threads never compete with the daemon's loop for the
# GIL: /healthz probed every 5 ms, first with nothing else happening (the baseline), then
# while another thread requests /status (JSON and HTML alternately) back to back.
_PROBE = r"""
import json, sys, threading, time, urllib.request
base, renders = sys.argv[1], int(sys.argv[2])
def get(path):
    t = time.perf_counter()
    with urllib.request.urlopen(base + path, timeout=120) as r:
        r.read()
    return time.perf_counter() - t
quiet = []
for _ in range(200):
    quiet.append(get("/healthz"))
    time.sleep(0.005)
done = threading.Event()
took = []
def render():
    for k in range(renders):
        took.append(get("/status?format=json" if k % 2 == 0 else "/status?format=html"))
    done.set()
threading.Thread(target=render).start()
busy = []
while not done.is_set():
    busy.append(get("/healthz"))
    time.sleep(0.005)
print(json.dumps({"quiet": quiet, "busy": busy, "renders": took}))
"""


async def _healthz_during_renders(d: Any, renders: int = 10) -> dict[str, list[float]]:
    """The daemon's own HTTP server on the in-process daemon; the probes from outside."""
    import json
    import sys

    server = d.server  # the daemon's own HTTP face, as built by the daemon
    bound = await server.start()
    stop = asyncio.Event()

    async def beat() -> None:  # what the daemon's heartbeat task does, so /healthz says ok
        while not stop.is_set():
            d.last_beat = time.monotonic()
            await asyncio.sleep(0.5)

    beating = asyncio.create_task(beat())
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _PROBE,
            f"http://{bound}",
            str(renders),
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await proc.communicate()
    finally:
        stop.set()
        await beating
        await server.stop()
    got: dict[str, list[float]] = json.loads(out)
    return got


def _p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[max(0, int(len(xs) * 0.99) - 1)]


def _chromium(binary: str, page: Path, tmp: Path) -> float:
    args: list[Any] = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        f"--user-data-dir={tmp / 'chrome'}",
        "--dump-dom",
        f"file://{page}",
    ]
    t0 = time.perf_counter()
    subprocess.run(args, capture_output=True, check=False, timeout=120)
    return time.perf_counter() - t0
