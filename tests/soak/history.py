"""The oracle's view of a run, on the simulated server's clock: each chat's stays in each
status (from the simulator's journal), the times watchd could not see or deliver, the
server-clock steps, and the config in force.

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
    """Time (server clock) watchd could not see or deliver, and how long after it ends
    it may still be catching up. ``user`` None: every identity."""

    start: float
    end: float
    recovery: float
    kind: str
    user: str | None = None

    @property
    def until(self) -> float:
        return self.end + self.recovery


@dataclass
class Stay:
    """One chat in one status, from ``entered`` to ``left`` (None: still, at the end)."""

    chat: str
    user: str
    status: str
    entered: float
    entry_heard: bool
    left: float | None = None
    exit: str = ""  # status | archived | deleted
    exit_heard: bool = False
    bumps: list[float] = field(default_factory=list)


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

    def name(self) -> str:
        merged = (
            f" ({len(self.stays)} stays watchd cannot tell apart)" if len(self.stays) > 1 else ""
        )
        return f"chat {self.chat[:8]} {self.status} #{self.number}{merged}"


class Timeline:
    """Server-clock conversions, blind windows, clock steps and configs of one run."""

    def __init__(self, run: Run, tol: Tolerances) -> None:
        self.tol = tol
        self.variants = [Variant.from_dict(v) for v in run.variants]
        clocks = [e for e in run.journal if e["kind"] == "clock"]
        self._walls = [e["wall"] for e in clocks]
        self._offsets = [e["offset"] for e in clocks]
        self.steps = [(e["at"], abs(e["offset"] - e["before"])) for e in clocks]
        self.windows = sorted(self._windows(run), key=lambda w: w.start)
        self._configs = [(self.server(w), int(v)) for w, v in run.configs]

    def server(self, wall: float) -> float:
        """The simulated server's clock at host time ``wall``."""
        i = bisect.bisect_right(self._walls, wall)
        return wall + (self._offsets[i - 1] if i else 0.0)

    def _windows(self, run: Run) -> Iterable[Window]:
        tol = self.tol
        for user, gaps in run.watch_gaps.items():
            for start, end in gaps:
                yield Window(self.server(start), self.server(end), LISTING, "unwatched", user)
        for killed, started in run.kills:
            end = started or run.observed_until
            yield Window(self.server(killed) - tol.persist, self.server(end), LISTING, "kill")
        for wall, _ in run.configs[1:]:
            yield Window(self.server(wall), self.server(wall) + tol.reload, LISTING, "reload")
        for start, end, mode in run.receiver_outages:
            yield Window(
                self.server(start),
                self.server(end or start),
                tol.receiver_recovery,
                f"receiver {mode}",
            )
        began: dict[str, float] = {}
        for e in run.journal:
            kind, at = e["kind"], e["at"]
            if kind == "restart":
                yield Window(at, at + e["downtime"], tol.coder_recovery, "coder restart")
            elif kind == "drop":
                yield Window(at, at, LISTING, "sockets dropped")
            elif kind == "faults":
                for key in ("error_rate", "throttle_next"):
                    if key not in e["faults"]:
                        continue
                    if e["faults"][key]:
                        began.setdefault(key, at)
                    elif key in began:
                        yield Window(began.pop(key), at, tol.coder_recovery, f"coder {key}")
        for key, at in began.items():
            yield Window(at, self.server(run.observed_until), tol.coder_recovery, f"coder {key}")

    def extend(self, t0: float, slack: float, user: str) -> float:
        """When something owed ``slack`` after ``t0`` is late: blind time overlapping it
        pushes the deadline to ``slack`` after the window's recovery."""
        d = t0 + slack
        for w in self.windows:
            if w.start > d:
                break
            if (w.user is None or w.user == user) and w.until >= t0:
                d = max(d, w.until + slack)
        return d

    def socket_lost(self, at: float, user: str) -> bool:
        """Whether an event queued at ``at`` may not have reached, or outlived, watchd."""
        return any(
            w.start - self.tol.persist <= at <= w.end
            for w in self.windows
            if w.kind in ("unwatched", "kill", "sockets dropped", "coder restart")
            and (w.user is None or w.user == user)
        )

    def steps_between(self, t0: float, t1: float) -> float:
        """Server-clock steps the estimate may not have followed by some time in [t0, t1]."""
        return sum(size for at, size in self.steps if t0 - self.tol.follow <= at <= t1)

    def budgets(self, status: str, t0: float, t1: float) -> tuple[float, float]:
        """The least and greatest budget of ``status`` in force at some time in [t0, t1]
        (a reload's old config counts until it is surely applied)."""
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
        chat, user = e["chat"], e["owner"]
        heard = e["heard"] > 0 and not line.socket_lost(e["at"], user)
        mine = out.setdefault(chat, [])
        current = mine[-1] if mine and mine[-1].left is None else None
        if kind == "bumped":
            if current is not None:
                current.bumps.append(e["updated_at"])
            continue
        if current is not None:
            current.left = e["updated_at"] if kind != "deleted" else e["at"]
            current.exit = "status" if kind in ("status", "created") else kind
            current.exit_heard = heard
        if kind in ("created", "status"):
            mine.append(Stay(chat, user, e["status"], e["updated_at"], heard))
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
    if a.left is None or any(s.exit_heard for s in run_of[:-1]):
        return False
    return line.extend(a.left, line.tol.observe, a.user) > b.entered
