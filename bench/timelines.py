"""Issue 27's rows: what the timelines and the agent metrics cost.

- RSS of a store of ``chats`` chats, each moved twice on the stream (so each has a
  timeline), with timelines on, against the same with a timeline that records nothing
  (what watchd held before timelines), each in its own fresh process.
- Forwarded events converted per second by the span pipeline with the agent metrics and
  the timeline hook on, against both off, in one process, alternated.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.cases import Row, _events, row

_RSS = r"""
import gc, json, sys
from watchd.coder.observing import ChatId, Observation
from watchd.detection.detector import Detector
from watchd.store.chats import ChatStore
from watchd.store.timelines import Timelines
n, on = int(sys.argv[1]), sys.argv[2] == "on"

class Nothing(Timelines):
    def add(self, *a, **k):
        pass

    def changes(self, *a, **k):
        pass

class Sink:
    def put(self, alert):
        pass

store = ChatStore()
timelines = Timelines(identity_of=store.identity_of) if on else Nothing()
det = Detector(store=store, sink=Sink(), timelines=timelines)
t = 1_800_000_000.0
steps = (("requires_action", "listing", 0.0), ("running", "watch", 10.0),
         ("requires_action", "watch", 20.0))
for status, via, dt in steps:
    changes = []
    for i in range(n):
        cid = ChatId(f"chat-{i:08d}")
        chat = Observation(id=cid, status=status, updated_at=t + dt, title=f"chat {i}")
        c = store.observe("a", chat, now=t + dt, via=via, kind="status_change")
        if c is not None:
            changes.append(c)
        if len(changes) >= 1000:
            det.apply("a", changes)
            changes = []
    det.apply("a", changes)
gc.collect()
rss = 0.0
for line in open("/proc/self/status"):
    if line.startswith("VmRSS:"):
        rss = int(line.split()[1]) / 1024
print(json.dumps({"rss": rss, "timelines": len(det.timelines)}))
"""


def timeline_rss(chats: int) -> list[Row]:
    def one(mode: str) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-c", _RSS, str(chats), mode],
            capture_output=True, text=True, check=True, timeout=600,
        )  # fmt: skip
        return json.loads(out.stdout.strip().splitlines()[-1])

    on, off = one("on"), one("off")
    assert on["timelines"] == chats, on
    return [
        row(
            f"RSS, {chats} chats each moved twice, timelines on",
            on["rss"],
            "MB",
            off["rss"],
            "the same with a timeline that records nothing (before timelines)",
            "≤ 1.25×",
        )
    ]


def pipeline_rate(events: int, rounds: int = 5) -> list[Row]:
    """Forwarded events per second through the span pipeline (no exporter): with the
    agent metrics on (issue 27's row), and with the metrics and the timeline hook on,
    each against both off; alternated rounds in one process."""
    from watchd.store.timelines import Timelines
    from watchd.telemetry.events import EventSource
    from watchd.telemetry.pipeline import SpanPipeline
    from watchd.telemetry.spans import SpanConverter

    batch = _events(50)
    source = EventSource("agent", "pod-1", "a1")
    known = {e["chatId"] for e in batch if "chatId" in e}
    timelines = Timelines(identity_of=lambda c: "a" if c in known else None)

    def rate(mode: str) -> float:
        p = SpanPipeline(converter=SpanConverter(), export=None, queue_size=events + len(batch))
        if mode == "all":
            p.on_forwarded = timelines.transport
        elif mode == "off":
            p.agents.observe = lambda event: None  # type: ignore[method-assign]
        n = 0
        while n < events:
            for e in batch:
                p.sink.emit(source, dict(e))
            n += len(batch)
        t0 = time.perf_counter()
        done = p.drain()
        return done / (time.perf_counter() - t0)

    got: dict[str, list[float]] = {"off": [], "metrics": [], "all": []}
    for _ in range(rounds):
        for mode, rates in got.items():
            rates.append(rate(mode))
    off = statistics.median(got["off"])
    return [
        row(
            "forwarded events converted per second, agent metrics on",
            statistics.median(got["metrics"]),
            "events/s",
            off,
            "metrics off, same process, alternated",
            "≥ 0.9×",
        ),
        row(
            "forwarded events converted per second, agent metrics and timelines on",
            statistics.median(got["all"]),
            "events/s",
            off,
            "both off, same process, alternated",
            "≥ 0.9×",
        ),
    ]
