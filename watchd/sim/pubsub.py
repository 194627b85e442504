"""The watch stream's publish/subscribe, as coderd's pubsub feeds its watch sockets.

A mixin of :class:`~watchd.sim.state.SimState` (it keeps the state's attribute names,
which the admin API and the tests read): one bounded queue per open socket, events
for a chat's owner only, with the ``event_loss`` fault and the era's publish size
limit (``pg_notify``'s 8000 bytes on older servers) applied here.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from typing import Any, cast

from watchd.sim.eras import Era
from watchd.sim.payloads import Records, watch_chat
from watchd.sim.records import Faults, SimChat, SimError, Subscriber


class PubSub:
    """subscribe / unsubscribe / publish / drop_watch over ``subscribers``."""

    era: Era
    rng: random.Random
    faults: Faults
    subscribers: set[Subscriber]
    subscriber_buffer: int
    published: int
    lost: int
    oversize: int
    # Told (subscriber, close code) when a socket must end: the server closes it.
    on_drop: list[Callable[[Subscriber, int], Any]]

    def subscribe(self, user_id: str, *, agent: str = "") -> Subscriber:
        if self.faults.subscribe_fail:
            raise SimError(
                500, "Internal error subscribing to chat events.", "pubsub: connection refused"
            )
        sub = Subscriber(
            user_id=user_id, queue=asyncio.Queue(maxsize=self.subscriber_buffer), agent=agent
        )
        self.subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)

    def publish(self, chat: SimChat, kind: str) -> None:
        # PubSub is only ever mixed into SimState, whose records the payload is built from.
        payload: dict[str, Any] = {"kind": kind, "chat": watch_chat(cast("Records", self), chat)}
        if kind == "action_required":
            payload["tool_calls"] = [
                {
                    "tool_call_id": f"call_{self.rng.getrandbits(32):x}",
                    "tool_name": "run_query",
                    "args": '{"sql":"select 1"}',
                }
            ]
        self.published += 1
        limit = self.era.publish_limit
        if limit is not None and len(json.dumps(payload)) > limit:
            self.oversize += 1
            return
        for sub in list(self.subscribers):
            if sub.user_id != chat.owner_id:
                continue
            if self.faults.event_loss and self.rng.random() < self.faults.event_loss:
                self.lost += 1
                continue
            try:
                sub.queue.put_nowait(payload)
            except asyncio.QueueFull:
                sub.dropped += 1

    def drop_watch(self, *, user_id: str | None = None, code: int = 1001) -> int:
        """End watch sockets abruptly (replica restart, network); returns how many."""
        n = 0
        for sub in list(self.subscribers):
            if user_id is None or sub.user_id == user_id:
                n += 1
                for cb in self.on_drop:
                    cb(sub, code)
        return n
