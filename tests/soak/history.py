"""The oracle's view of a run: each chat's stays in each status (from the simulator's
journal), the times watchd could not see or deliver, the server-clock steps, and the
config in force.

Two clocks: the simulated server's (stamps, and so budgets, are on it) and the host's
(``wall``: what happened before what, and how long watchd took). A stay carries both;
windows, deadlines and arrivals are host times, and a due time on the server's clock is
turned into the host time the server's clock reached it (:meth:`Timeline.wall_of`).

A stay's entry or exit was *heard* when its watch event was queued to a socket of the
owner and no socket loss (a gap in the simulator's view, a drop, a Coder restart, a kill
-9) came within the persistence window after it. Two stays in one status are one
*episode* to the oracle when watchd could not have told them apart: every move between
them went unheard and no listing was sure to fall between them.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from tests.soak.record import Run
from tests.soak.shape import WATCHED, Variant
from tests.soak.tolerances import LISTING, Tolerances


@dataclass(frozen=True)
class Window:
    """Time (host clock) watchd could not see or deliver, from ``start`` to ``end``, and
    how long after it ends work it interrupted may still take (``recovery``: a failed
    re-read is retried 30 s later, a failed flush at the next one). ``user`` None: every
    identity."""

    start: float
    end: float
    recovery: float
    kind: str
    user: str | None = None


@dataclass
class Stay:
    """One chat in one status, from ``entered`` to ``left`` (server clock; None: still, at
    the end), the same on the host's clock, and its step commits (server, host)."""

    chat: str
    user: str
    status: str
    entered: float
    entered_wall: float
    entry_heard: bool
    left: float | None = None
    left_wall: float | None = None
    exit: str = ""  # status | archived | deleted
    exit_heard: bool = False
    bumps: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class Episode:
    """Stays in one watched status that watchd could not tell apart (usually one)."""

    stays: list[Stay]
    number: int  # the chat's n-th episode in this status

    @property
    def first(self) -> Stay:
        return self.stays[0]

    @property
    def last(self) -> Stay:
        return self.stays[-1]

    @property
    def chat(self) -> str:
        return self.first.chat

    @property
    def status(self) -> str:
        return self.first.status

    @property
    def entered(self) -> float:
        return self.first.entered

    @property
    def left(self) -> float | None:
        return self.last.left

    @property
    def entered_wall(self) -> float:
        return self.first.entered_wall

    @property
    def left_wall(self) -> float | None:
        return self.last.left_wall

    def name(self) -> str:
        merged = (
            f" ({len(self.stays)} stays watchd cannot tell apart)" if len(self.stays) > 1 else ""
        )
        return f"chat {self.chat[:8]} {self.status} #{self.number}{merged}"


class Timeline:
    """Clock conversions, blind windows, clock steps and configs of one run (host times)."""

    def __init__(self, run: Run, tol: Tolerances) -> None:
        self.tol = tol
        self.variants = [Variant.from_dict(v) for v in run.variants]
        clocks = [e for e in run.journal if e["kind"] == "clock"]
        self._walls = [e["wall"] for e in clocks]
        self._offsets = [e["offset"] for e in clocks]
        self.steps = [(e["wall"], abs(e["offset"] - e["before"])) for e in clocks]
        self.windows = sorted(self._windows(run), key=lambda w: w.start)
        self._configs = [(w, int(v)) for w, v in run.configs]

    def server(self, wall: float) -> float:
        """The simulated server's clock at host time ``wall``."""
        i = bisect.bisect_right(self._walls, wall)
        return wall + (self._offsets[i - 1] if i else 0.0)

    def wall_of(self, server: float) -> float:
        """The host time the server's clock first reached ``server``."""
        bounds = [float("-inf"), *self._walls, float("inf")]
        offsets = [0.0, *self._offsets]
        for i, offset in enumerate(offsets):
            w = max(bounds[i], server - offset)
            if w < bounds[i + 1]:
                return w
        return server - offsets[-1]

    def _windows(self, run: Run) -> Iterable[Window]:
        tol = self.tol
        # Until a socket is back and its seed listing applied, the identity is not ready.
        for user, gaps in run.watch_gaps.items():
            for start, end in gaps:
                yield Window(start, end + LISTING, 0.0, "unwatched", user)
        for killed, started in run.kills:
            end = (started or run.observed_until) + LISTING
            yield Window(killed - tol.persist, end, 0.0, "kill")
        for wall, _ in run.configs[1:]:
            yield Window(wall, wall + tol.reload + LISTING, 0.0, "reload")
        for start, end, mode in run.receiver_outages:
            yield Window(start, end or start, tol.receiver_recovery, f"receiver {mode}")
        began: dict[str, float] = {}
        for e in run.journal:
            kind, wall = e["kind"], e["wall"]
            if kind == "restart":
                yield Window(wall, wall + e["downtime"], tol.coder_recovery, "coder restart")
            elif kind == "drop":
                yield Window(wall, wall, LISTING, "sockets dropped")
            elif kind == "faults":
                for key in ("error_rate", "throttle_next"):
                    if key not in e["faults"]:
                        continue
                    if e["faults"][key]:
                        began.setdefault(key, wall)
                    elif key in began:
                        yield Window(began.pop(key), wall, tol.coder_recovery, f"coder {key}")
        for key, wall in began.items():
            yield Window(wall, run.observed_until, tol.coder_recovery, f"coder {key}")

    def extend(self, t0: float, slack: float, user: str) -> float:
        """When something owed ``slack`` after ``t0`` is late: blind time within that span
        pushes the deadline to ``slack`` after the window's end and recovery."""
        d = t0 + slack
        for w in self.windows:
            if w.start > d:
                break
            if (w.user is None or w.user == user) and w.end >= t0:
                d = max(d, w.end + w.recovery + slack)
        return d

    def socket_lost(self, wall: float, user: str) -> bool:
        """Whether an event queued at ``wall`` may not have reached, or outlived, watchd."""
        return any(
            w.start - self.tol.persist <= wall <= w.end
            for w in self.windows
            if w.kind in ("unwatched", "kill", "sockets dropped", "coder restart")
            and (w.user is None or w.user == user)
        )

    def steps_between(self, t0: float, t1: float) -> float:
        """Server-clock steps the estimate may not have followed at some host time in
        [t0, t1]."""
        return sum(size for at, size in self.steps if t0 - self.tol.follow <= at <= t1)

    def budgets(self, status: str, t0: float, t1: float) -> tuple[float, float]:
        """The least and greatest budget of ``status`` in force at some host time in
        [t0, t1] (a reload's old config counts until it is surely applied)."""
        used: set[int] = set()
        for i, (at, v) in enumerate(self._configs):
            nxt = self._configs[i + 1][0] + self.tol.reload if i + 1 < len(self._configs) else None
            if at <= t1 and (nxt is None or nxt >= t0):
                used.add(v)
        budgets = [self.variants[v].budget(status) for v in used or {0}]
        return min(budgets), max(budgets)


def stays(run: Run, line: Timeline) -> dict[str, list[Stay]]:
    """Each chat's stays, in order, from the simulator's journal."""
    out: dict[str, list[Stay]] = {}
    for e in run.journal:
        kind = e["kind"]
        if kind not in ("created", "status", "archived", "deleted", "bumped"):
            continue
        chat, user, wall = e["chat"], e["owner"], e["wall"]
        heard = e["heard"] > 0 and not line.socket_lost(wall, user)
        mine = out.setdefault(chat, [])
        current = mine[-1] if mine and mine[-1].left is None else None
        if kind == "bumped":
            if current is not None:
                current.bumps.append((e["updated_at"], wall))
            continue
        if current is not None:
            current.left = e["updated_at"] if kind != "deleted" else e["at"]
            current.left_wall = wall
            current.exit = "status" if kind in ("status", "created") else kind
            current.exit_heard = heard
        if kind in ("created", "status"):
            # A created chat's age: it entered before the entry was written.
            entered_wall = wall - (e["at"] - e["updated_at"])
            mine.append(Stay(chat, user, e["status"], e["updated_at"], entered_wall, heard))
    return out


def episodes(run: Run, line: Timeline) -> list[Episode]:
    """Every episode in a watched status, stays watchd could not tell apart merged."""
    out: list[Episode] = []
    for chat_stays in stays(run, line).values():
        numbers: dict[str, int] = {}
        last: dict[str, tuple[int, Episode]] = {}  # status → (index of its last stay, episode)
        for i, s in enumerate(chat_stays):
            if s.status not in WATCHED:
                continue
            prev = last.get(s.status)
            if prev is not None and _indistinct(chat_stays[prev[0] : i + 1], line):
                prev[1].stays.append(s)
                last[s.status] = (i, prev[1])
                continue
            numbers[s.status] = numbers.get(s.status, 0) + 1
            ep = Episode([s], numbers[s.status])
            out.append(ep)
            last[s.status] = (i, ep)
    return out


def _indistinct(run_of: list[Stay], line: Timeline) -> bool:
    """Whether the first and last of these consecutive stays (one status) look like one
    stay to watchd: no move between them was heard, and no listing had to fall between."""
    a, b = run_of[0], run_of[-1]
    if a.left_wall is None or any(s.exit_heard for s in run_of[:-1]):
        return False
    return line.extend(a.left_wall, line.tol.observe, a.user) > b.entered_wall
