"""The detection tail in one process, without the network: ``n`` chats past their budget,
confirmed by one listing, fired, grouped and notified, to split issue 18's "p99 beyond
the daemon's own listing" into its parts.

The detector, ledger, renderer and dispatcher are the real ones; the Coder side is the
unit tests' fake confirmer (``tests/unit/test_detector.py``: a listing that applies the
same chats, facts without workspace reads) and the receiver records the notification,
whose webhook body is then encoded as the webhook receiver would. A burst fires as the
listing's pages arrive (``watchd/detection/paged.py``), so its cost is split: the loop's
CPU after the last page (what the tail waits for beyond the listing), and the firing per
alert wherever it ran (the listing's CPU less the same listing with nothing due, plus
the part after it). Each part is CPU time of the loop thread, so a busy machine moves
it less than wall time. The body's baseline is ``orjson.dumps`` of the same alerts as
plain dicts.
"""

from __future__ import annotations

import asyncio
import gc
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.cases import Row, row


async def _until(done: Callable[[], bool]) -> None:
    for _ in range(60_000):  # polled every 1 ms (a busy poll would count as the tail's CPU)
        if done():
            return
        await asyncio.sleep(0.001)
    raise TimeoutError("the burst never got there")


# The fake listing's pages, and how long each waits for its answer: about what the
# latency case's listing takes per page of 500 (1.3 s for 20 pages), spent in the
# simulator on the other core while the daemon's loop is free.
PAGE = 500
PAGE_WAIT = 0.05


def tail(n: int) -> list[Row]:
    return asyncio.run(_tail(n))


async def _tail(n: int) -> list[Row]:
    from tests.unit.test_detector import rig
    from tests.unit.test_dispatch import Recorder
    from watchd.alerting import routing
    from watchd.alerting.dispatch import Dispatcher

    try:
        from watchd.alerting.receivers.simple import webhook_json
    except ImportError:  # a tree from before it (measuring an older commit)
        from watchd.alerting.receivers.simple import (  # type: ignore[attr-defined]
            dumps,
            webhook_body,
        )

        def webhook_json(n: Any) -> bytes:  # type: ignore[misc]
            return bytes(dumps(webhook_body(n)))

    from watchd.alerting.silencing import Inhibitor, Silencer
    from watchd.config.alerting import RouteConfig
    from watchd.config.watching import Budgets
    from watchd.kits import logs
    from watchd.store.sqlite import StateFile

    logs.configure(level="warning", json=True)  # as the daemon runs: debug lines filtered
    tmp = Path(tempfile.mkdtemp(prefix="watchd-bench-tail-"))
    db = StateFile(tmp / "state.sqlite3")
    recorder = Recorder()
    route = routing.build(
        RouteConfig.model_validate({"receiver": "r", "group_wait": "0s", "group_interval": "1s"})
    )
    async with rig(Budgets(running=60), db=db) as r:
        d = Dispatcher(
            route=route,
            notifiers={"r": recorder},
            db=db,
            silencer=Silencer([]),
            inhibitor=Inhibitor([]),
            wall=r.wall,
        )
        r.det.ledger.sink = d
        r.ready()
        r.health.set_state("seeding")  # no verdicts while the chats are put in
        for i in range(n):
            r.see(f"chat-{i:06d}", "running", r.clock.now() - 120, workspace_id=f"ws-{i % 50}")
        db.flush()
        gc.collect()
        confirmer = r.det.watched["a"].confirmer
        listing = [0.0, 0.0]  # loop CPU, wall seconds

        async def timed_relist(*, on_page: Callable[[Any], None] | None = None) -> None:
            # Pages as the watcher applies them, each answered PAGE_WAIT after it was asked
            # for: what the loop does meanwhile (drafting the burst's alerts) is counted
            # in the listing's CPU, not in the part after it.
            started, began = time.thread_time(), time.monotonic()
            chats = list(r.server.chats.values())
            present: set[str] = set()
            try:
                for at in range(0, len(chats), PAGE):
                    await asyncio.sleep(PAGE_WAIT)
                    now = r.clock.now()
                    changes = []
                    for chat in chats[at : at + PAGE]:
                        present.add(chat.id)
                        change = r.store.observe("a", chat, now=now, via="listing")
                        if change is not None:
                            changes.append(change)
                    if changes:
                        r.det.apply("a", changes)
                    if on_page is not None:
                        on_page(present)
            finally:
                listing[0] += time.thread_time() - started
                listing[1] += time.monotonic() - began

        # The same listing with nothing due (still seeding): what the pages alone cost.
        await timed_relist()
        bare = listing[0]
        listing[:] = [0.0, 0.0]
        confirmer.relist = timed_relist  # type: ignore[method-assign]
        t0 = time.thread_time()
        r.ready()  # seeded: every chat is due; one listing confirms them
        await _until(lambda: len(d.alerts) >= n)
        t1 = time.thread_time()
        assert r.server.lists == 0, "the bench's paged listing was not the one used"
        await _until(lambda: bool(recorder.sent))
        t2 = time.thread_time()
        body = webhook_json(recorder.sent[0])
        t3 = time.thread_time()
        plain = [a.to_json() for a in recorder.sent[0].alerts]
        t4 = time.thread_time()
        orjson.dumps({"alerts": plain})
        t5 = time.thread_time()
        # Process CPU: the write runs on the state writer's thread while this one waits.
        w0 = time.process_time()
        db.flush()  # what the state writer then does with the burst (a worker thread)
        written = time.process_time() - w0
        await d.close(deadline=0.5)
    db.close()
    after = t1 - t0 - listing[0]  # the loop's CPU from the last page to the last alert
    fired = listing[0] - bare + after  # firing, wherever it ran
    return [
        row(
            f"tail: {n} chats from the last page to fired (loop CPU)",
            after * 1000,
            "ms",
            listing[0] * 1000,
            f"loop CPU during the listing, chats fired as their pages arrive ({n // PAGE} "
            f"pages, {listing[1]:.2f} s)",
        ),
        row(
            "tail: … firing per alert, during the listing and after it",
            fired / n * 1e6,
            "µs",
            bare / n * 1e6,
            "the same listing with nothing due, per chat",
        ),
        row(
            f"tail: fired → notification handed to the receiver ({n} alerts)",
            (t2 - t1) * 1000,
            "ms",
        ),
        row(
            f"tail: webhook body encoded ({len(body) / 1e6:.1f} MB)",
            (t3 - t2) * 1000,
            "ms",
            (t5 - t4) * 1000,
            "orjson.dumps of the same alerts as plain dicts",
        ),
        row(
            "tail: the three together, after the last page",
            (after + t3 - t1) * 1000,
            "ms",
            target="issue 18: < 500 ms beyond the listing, POST included",
        ),
        row(f"tail: the state write of the burst ({n} chats and alerts)", written * 1000, "ms"),
    ]
