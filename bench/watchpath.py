"""Where a watch event's CPU goes inside the daemon, measured in one process.

Frames shaped as the simulator's firehose sends them (``bench/cases.throughput``: 100
chats, every frame a transition) go through the daemon's own path in bursts of 50, and
the path is cut after each part: the frame decoded into an observation, then applied to
the store, then handed to the detector without the timeline and the time-in-status
histogram, then the whole path. Each part is µs per event, the minimum over alternated
rounds, against ``orjson.loads`` of the same frames (what the bare consumer does) in the
same rounds. The socket reads and the event loop, which the bare consumer pays too, are
not in it: ``throughput`` measures the whole daemon.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson

from bench.cases import Row, row

CHATS = 100
BURST = 50


def _frames(n: int, start: float) -> list[bytes]:
    uid = "11111111-2222-4333-8444-555555555555"
    ids = [f"{uid[:8]}-0000-4000-8000-{i:012d}" for i in range(CHATS)]
    out = []
    for i in range(n):
        status = "running" if (i // CHATS) % 2 == 0 else "waiting"
        ts = datetime.fromtimestamp(start + i * 1e-4, UTC).isoformat().replace("+00:00", "Z")
        cid = ids[i % CHATS]
        out.append(
            orjson.dumps(
                {
                    "kind": "status_change",
                    "chat": {
                        "id": cid,
                        "owner_id": uid,
                        "title": "bench",
                        "status": status,
                        "created_at": ts,
                        "updated_at": ts,
                        "root_chat_id": cid,
                    },
                }
            )
        )
    return out


def watch_path(events: int, rounds: int = 9) -> list[Row]:
    """The parts, as rows (the detector needs a running loop: its confirm tasks start)."""
    return asyncio.run(_measure(events, rounds))


async def _measure(events: int, rounds: int) -> list[Row]:
    from watchd.coder.wire import read_event
    from watchd.config.watching import Budgets
    from watchd.daemon.metrics import Durations
    from watchd.detection.detector import Detector
    from watchd.kits.clock import ServerClock
    from watchd.store.chats import ChatStore
    from watchd.store.health import IdentityHealth
    from watchd.store.timelines import Timelines

    class Sink:
        def put(self, alert: Any) -> None:
            pass

    class Untold(Timelines):
        def changes(self, *args: Any, **kwargs: Any) -> None:
            pass

    def rig(told: bool) -> tuple[ChatStore, Detector, ServerClock]:
        store = ChatStore()
        durations = Durations()
        durations.add("a")
        timelines = Timelines(max_chats=store.capacity, identity_of=store.identity_of)
        det = Detector(
            store=store,
            sink=Sink(),
            on_left=durations.observe if told else None,
            timelines=timelines if told else Untold(),
        )
        clock = ServerClock()
        health = IdentityHealth(name="a", deployment="x", server_clock=clock, unhealthy_after=60)
        det.register(health, confirmer=None, budgets=Budgets(), labels={})  # type: ignore[arg-type]
        return store, det, clock

    def through(
        store: ChatStore | None, det: Detector | None, clock: ServerClock | None
    ) -> Callable[[list[bytes]], None]:
        def run(frames: list[bytes]) -> None:
            for i in range(0, len(frames), BURST):
                burst = [read_event(f) for f in frames[i : i + BURST]]
                if store is None or clock is None:
                    continue
                changes = store.observe_events("a", burst, now=clock.now())  # type: ignore[arg-type]
                if det is not None and changes:
                    det.apply("a", changes)

        return run

    def bare(frames: list[bytes]) -> None:
        loads = orjson.loads
        for f in frames:
            loads(f)

    store_rig = rig(False)
    plain = rig(False)
    told = rig(True)
    parts: list[tuple[str, Callable[[list[bytes]], None]]] = [
        ("bare", bare),
        ("decode", through(None, None, None)),
        ("store", through(store_rig[0], None, store_rig[2])),
        ("detector", through(*plain)),
        ("whole", through(*told)),
    ]
    best = {name: float("inf") for name, _ in parts}
    start = time.time() - 3600.0
    for r in range(rounds + 1):
        frames = _frames(events, start + r * events * 1e-4 * 1.001)
        for name, fn in parts:
            t0 = time.process_time()
            fn(frames)
            took = (time.process_time() - t0) / events * 1e6
            if r:  # the first round warms the store and the caches
                best[name] = min(best[name], took)
    for _, det, _ in (store_rig, plain, told):
        w = det.watched["a"]
        if w.task is not None:
            w.task.cancel()
    base = best["bare"]
    said = "orjson.loads of the same frames, same rounds"
    return [
        row("watch path in one process: frame → Observation", best["decode"], "µs", base, said),
        row("  … → the store's record and change", best["store"], "µs", base, said),
        row("  … → the detector, no timeline or histogram", best["detector"], "µs", base, said),
        row(
            "  … → timeline entry and time-in-status too (the whole path)",
            best["whole"],
            "µs",
            base,
            said,
        ),
    ]
