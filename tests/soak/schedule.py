"""The soak's actions, all drawn from the seed before anything runs.

Chats live in slots (each slot belongs to one identity); a slot's chat moves through
era E's statuses, sometimes without its event, gets step commits while running, and
now and then is archived or hard-deleted and replaced by a new chat. Faults — Coder
answering errors or 429, a Coder restart, watch sockets dropped, the server's clock
stepped, the receiver down, kill -9 and restart, SIGHUP to another config — are spread
over the run between a quiet start and a quiet end. The same seed and length give the
same list of actions; only when each runs depends on the machine.

How long a chat stays in a watched status is drawn from three classes, relative to the
budgets and the oracle's tolerances: well short of the budget, in the grey zone, or well
past it — so most episodes get a clear verdict.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from tests.soak.shape import IDLE, WATCHED, Shape, Variant
from tests.soak.tolerances import Tolerances

NEXT: dict[str, tuple[tuple[str, float], ...]] = {
    "waiting": (("running", 1.0),),
    "error": (("running", 1.0),),
    "paused": (("running", 0.5), ("waiting", 0.5)),
    "running": (
        ("waiting", 0.5),
        ("requires_action", 0.2),
        ("interrupting", 0.12),
        ("error", 0.1),
        ("paused", 0.08),
    ),
    "requires_action": (("running", 0.75), ("waiting", 0.15), ("interrupting", 0.1)),
    "interrupting": (("waiting", 0.85), ("error", 0.15)),
}
FIRST = (
    ("waiting", 0.35),
    ("running", 0.35),
    ("requires_action", 0.1),
    ("interrupting", 0.05),
    ("error", 0.1),
    ("paused", 0.05),
)
SILENT = 0.3  # transitions written without their watch event
ARCHIVE, DELETE = 0.02, 0.015  # at each move, the chat's life ends instead
SHORT, GREY = 0.4, 0.1  # dwell classes in a watched status; the rest is long


@dataclass(frozen=True)
class Action:
    """One thing the driver does ``at`` seconds after the start (< 0: before the daemon
    starts). Chat actions name a ``slot``; ``value``, ``code`` and ``mode`` are the
    kind's parameters (see :mod:`tests.soak.driver`)."""

    at: float
    kind: str
    slot: int = -1
    status: str = ""
    silent: bool = False
    value: float = 0.0
    code: int = 0
    mode: str = ""


def _pick(rng: random.Random, table: Sequence[tuple[str, float]]) -> str:
    roll, acc = rng.random(), 0.0
    for item, weight in table:
        acc += weight
        if roll < acc:
            return item
    return table[-1][0]


class _Dwell:
    """How long a chat stays in a status, by class."""

    def __init__(self, variants: Sequence[Variant], tol: Tolerances) -> None:
        self.variants = variants
        self.early = tol.early + tol.max_clock_step
        self.page = tol.page(2, tol.max_clock_step)

    def draw(self, rng: random.Random, status: str) -> float:
        if status in IDLE:
            return rng.uniform(1.0, 20.0)
        lo = min(v.budget(status) for v in self.variants)
        hi = max(v.budget(status) for v in self.variants)
        roll = rng.random()
        if roll < SHORT:
            return rng.uniform(0.3, max(0.5, lo - self.early - 2.0))
        if roll < SHORT + GREY:
            return rng.uniform(lo - self.early, hi + self.page)
        return rng.uniform(hi + self.page + 3.0, hi + self.page + 55.0)


def _slot_life(
    rng: random.Random, slot: int, shape: Shape, dwell: _Dwell, hold_silent: float
) -> list[Action]:
    end = shape.seconds
    out: list[Action] = []
    status = _pick(rng, FIRST)
    age = rng.uniform(0.0, 8.0)
    out.append(Action(-1.0, "create", slot, status, value=age))
    t = -age
    # status -> when it was left by a transition without its event, while every move since
    # was silent too: re-entering it that soon is made audible (a listing must have been
    # possible in between, or watchd cannot tell the two stays apart).
    silent_exits: dict[str, float] = {}
    while True:
        stay = dwell.draw(rng, status)
        if status == "running":
            b = max(t, 0.0) + rng.uniform(4.0, 15.0)
            while b < min(t + stay - 0.5, end - 1.0):
                out.append(Action(b, "bump", slot))
                b += rng.uniform(4.0, 15.0)
        t = max(t + stay, 1.0)
        if t >= end:
            break
        roll = rng.random()
        if roll < ARCHIVE + DELETE:
            out.append(Action(t, "archive" if roll < ARCHIVE else "delete", slot))
            t += rng.uniform(1.0, 8.0)
            if t >= end:
                return out
            status = "running" if rng.random() < 0.65 else "waiting"
            out.append(Action(t, "create", slot, status))
            silent_exits.clear()
            continue
        nxt = _pick(rng, NEXT[status])
        silent = rng.random() < SILENT
        left = silent_exits.get(nxt)
        if left is not None and t - left < hold_silent:
            silent = False
        if silent:
            silent_exits[status] = t
        else:
            silent_exits.clear()
        out.append(Action(t, "move", slot, nxt, silent=silent))
        status = nxt
    if status in WATCHED:
        out.append(Action(end, "move", slot, "waiting"))
    return out


def _windows(rng: random.Random, shape: Shape, kind: str) -> list[float]:
    """Start times of one fault kind: stratified over the fault span, one per slice."""
    lo, hi = shape.quiet_start, shape.seconds - shape.quiet_end
    count = max(1, round(shape.per_minute[kind] * shape.minutes))
    width = (hi - lo) / count
    return [lo + i * width + rng.uniform(0.05, 0.6) * width for i in range(count)]


def _faults(rng: random.Random, shape: Shape, variants: int) -> list[Action]:
    out: list[Action] = []
    for t in _windows(rng, shape, "kill"):
        out += [Action(t, "kill"), Action(t + rng.uniform(0.5, 5.0), "start")]
    variant = 0
    for t in _windows(rng, shape, "sighup"):
        if rng.random() < 0.75:
            variant = (variant + 1) % variants
        out.append(Action(t, "sighup", code=variant))
    for t in _windows(rng, shape, "receiver_outage"):
        mode = rng.choice(("503", "429", "reset"))
        out += [
            Action(t, "receiver_down", mode=mode),
            Action(t + rng.uniform(3, 15), "receiver_up"),
        ]
    for t in _windows(rng, shape, "coder_errors"):
        rate, code = rng.choice((1.0, 0.5)), rng.choice((500, 502, 503))
        out += [
            Action(t, "coder_errors", value=rate, code=code),
            Action(t + rng.uniform(2.0, 8.0), "coder_ok"),
        ]
    for t in _windows(rng, shape, "throttle"):
        out += [
            Action(t, "throttle", code=rng.randint(3, 8), value=rng.choice((1.0, 2.0))),
            Action(t + 5.0, "throttle_off"),
        ]
    for t in _windows(rng, shape, "sim_restart"):
        out.append(Action(t, "sim_restart", value=rng.uniform(1.0, 4.0)))
    for t in _windows(rng, shape, "drop_watch"):
        out.append(Action(t, "drop_watch", code=rng.choice((1006, 1001))))
    offset = 0.0
    for t in _windows(rng, shape, "clock_step"):
        step = rng.uniform(1.0, shape.max_clock_step) * rng.choice((-1, 1))
        if abs(offset + step) > shape.max_clock_offset:
            step = -step
        offset += step
        out.append(Action(t, "clock", value=round(offset, 3)))
    return out


def plan(seed: int, shape: Shape, variants: Sequence[Variant], tol: Tolerances) -> list[Action]:
    """Every action of a soak, in the order they run."""
    dwell = _Dwell(variants, tol)
    hold_silent = tol.observe + 2.0
    actions: list[Action] = []
    for slot in range(shape.identities * shape.chats):
        actions += _slot_life(random.Random(f"{seed}:{slot}"), slot, shape, dwell, hold_silent)
    actions += _faults(random.Random(f"{seed}:faults"), shape, len(variants))
    actions.append(Action(shape.seconds, "end"))
    order = {"create": 0, "end": 9}
    return sorted(actions, key=lambda a: (a.at, order.get(a.kind, 1)))


def owner(slot: int, shape: Shape) -> int:
    """The identity (index) a slot's chats belong to."""
    return slot % shape.identities
