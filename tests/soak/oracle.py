"""The soak's oracle: judges what reached the receiver against the simulator's history.

Every episode (a chat's stay in a watched status, :mod:`tests.soak.history`) is
classified by how long it lasted against its budget and the tolerances the config gives
(:mod:`tests.soak.tolerances`):

- **should page**: it was still in the status at its page deadline (budget from the
  latest clock start watchd could have had, plus the page tolerance and any blind time);
- **must not page**: it left before budget − the early tolerance (the Date header's
  resolution and clock steps not yet followed) — watchd could not have fired in time;
- **grey**: in between; a page is allowed, not owed.

A page is the first notification that carries a ChatStuck/ChatStranded alert firing; it
belongs to the episode of that chat and status whose stay contains the alert's clock
start (``since``, the server's own stamp). The failures:

- **missed**: a should-page episode with no page;
- **false**: a page for a must-not-page episode, one before due − early, or one whose
  clock start lies in no stay of that chat and status;
- **duplicate**: an episode paged under two fingerprints (one stay, two alerts); an alert
  sent firing again after its resolve was delivered; or a group notified again with
  nothing new before repeat_interval (Alertmanager's dedup), unless a kill -9 came right
  after the first (a crash between a send and its record re-sends once: docs/alerting.md);
- **late**: a page after the deadline, or a resolve after the resolve deadline;
- **missing resolve**: a paged episode that ended, with no resolve by the end;
- **false resolve**: a resolve delivered before the chat left the status.

Anything else is a failure too: a payload the receiver refused as malformed, a daemon
that exited by itself, an alert other than the chat alerts (IdentityUnhealthy only when
some blind time outlasted ``unhealthy_after``), a history the simulator could not keep.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.soak.history import Episode, Timeline, episodes
from tests.soak.notifications import Other, Page, read, unchanged
from tests.soak.record import Run
from tests.soak.shape import Variant
from tests.soak.tolerances import Tolerances

KINDS = ("missed", "false", "duplicate", "late", "missing resolve", "false resolve", "other")
EPSILON = 0.002  # stamps go through RFC 3339 text (microseconds) and floats


@dataclass(frozen=True)
class Failure:
    kind: str  # one of KINDS
    what: str  # the episode, alert or notification
    why: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.what}: {self.why}"


@dataclass
class Judged:
    """An episode's class and its times: due on the server's clock (earliest possible,
    latest clock start), those as host times, and the page deadline (host)."""

    episode: Episode
    verdict: str  # should | grey | must-not | unjudged
    due_lo: float
    due_lo_wall: float
    due_hi_wall: float
    deadline: float
    early: float
    budgets: tuple[float, float] = (0.0, 0.0)
    pages: list[Page] = field(default_factory=list)

    def describe(self, start: float) -> str:
        """The episode for a failure line: chat, status, identity, when (seconds into the
        run), its budget and class."""
        ep = self.episode
        left = f"{ep.left_wall - start:.1f}s" if ep.left_wall is not None else "the end"
        lo, hi = self.budgets
        budget = f"{lo:g}s" if lo == hi else f"{lo:g}–{hi:g}s"
        return (
            f"{ep.name()} of {ep.first.user} [{ep.entered_wall - start:.1f}s → {left}, "
            f"budget {budget}, {self.verdict}]"
        )


@dataclass
class Verdict:
    run: Run
    tol: Tolerances
    judged: list[Judged]
    failures: list[Failure]
    notes: Counter[str]
    page_latency: list[float]
    resolve_latency: list[float]

    @property
    def ok(self) -> bool:
        return not self.failures

    def count(self, kind: str) -> int:
        return sum(1 for f in self.failures if f.kind == kind)


def judge(run: Run) -> Verdict:
    variants = [Variant.from_dict(v) for v in run.variants]
    tol = Tolerances.of(
        variants, max_clock_step=run.max_clock_step, receiver_retry_after=run.receiver_retry_after
    )
    line = Timeline(run, tol)
    end = run.observed_until
    v = Verdict(run, tol, [], [], Counter(), [], [])
    pages, others = read(run)
    _others(others, line, run, v)
    v.judged = _assess(episodes(run, line), line, end)
    _attribute(v.judged, pages, v.failures)
    for j in v.judged:
        _check(j, line, end, v, start=run.started)
    _dedup(run, v.failures, tol, v.notes)
    _harness(run, v.failures)
    return v


def _others(others: list[Other], line: Timeline, run: Run, v: Verdict) -> None:
    """Alerts other than the chat alerts: IdentityUnhealthy only after blind time longer
    than ``unhealthy_after``; anything else is not the soak's doing."""
    blind_for = max((w.end - w.start for w in line.windows), default=0.0)
    unhealthy = min(variant["unhealthy_after"] for variant in run.variants)
    for o in others:
        v.notes[f"alert {o.name}"] += 1
        if o.name != "IdentityUnhealthy" or blind_for < unhealthy - 1.0:
            v.failures.append(
                Failure("other", f"{o.name} {o.labels}", "an alert the soak does not cause")
            )


def _clocks(ep: Episode, line: Timeline) -> list[float]:
    """For each stay, the latest clock start watchd may hold (server clock): the entry
    when its event was heard, else the updated_at a listing finds (step commits move it)
    by the time one surely ran."""
    out = []
    for s in ep.stays:
        clock = s.entered
        if not s.entry_heard:
            seen = line.extend(s.entered_wall, line.tol.observe, s.user)
            clock = max([s.entered, *(b for b, wall in s.bumps if wall <= seen)])
        out.append(clock)
    return out


def _assess(eps: list[Episode], line: Timeline, end: float) -> list[Judged]:
    """Each episode's due times, deadline and class (``end``: host time observing ended)."""
    tol = line.tol
    dues: list[list[float]] = []
    out: list[Judged] = []
    for ep in eps:
        stop = ep.left_wall if ep.left_wall is not None else end
        lo, hi = line.budgets(ep.status, ep.entered_wall, stop)
        due = [line.wall_of(c + hi) for c in _clocks(ep, line)]
        due_lo = ep.entered + lo
        due_lo_wall = line.wall_of(due_lo)
        early = tol.early + line.steps_between(due_lo_wall, max(due))
        dues.append(due)
        out.append(Judged(ep, "", due_lo, due_lo_wall, max(due), 0.0, early, (lo, hi)))
    # Chats of one identity due together are confirmed one after another.
    by_user: dict[str, list[float]] = {}
    for j in out:
        by_user.setdefault(j.episode.first.user, []).append(j.due_lo_wall)
    window = tol.confirm(tol.confirm_threshold)
    for j, due in zip(out, dues, strict=True):
        ep, user = j.episode, j.episode.first.user
        together = sum(1 for d in by_user[user] if j.due_lo_wall - window <= d <= j.due_hi_wall)
        slack = tol.page(together, line.steps_between(j.due_lo_wall, j.due_hi_wall))
        deadlines = [line.extend(d, slack, user) for d in due]
        owed = [
            dl
            for s, dl in zip(ep.stays, deadlines, strict=True)
            if (s.left_wall if s.left_wall is not None else end) >= dl
        ]
        # On the server's clock: how long it stayed, against its budget.
        stayed_until = ep.left if ep.left is not None else line.server(end)
        if owed:
            j.verdict, j.deadline = "should", min(owed)
        elif stayed_until < j.due_lo - j.early:
            j.verdict, j.deadline = "must-not", max(deadlines)
        elif ep.left is None:
            j.verdict, j.deadline = "unjudged", max(deadlines)
        else:
            j.verdict, j.deadline = "grey", max(deadlines)
    return out


def _attribute(judged: list[Judged], pages: dict[str, Page], failures: list[Failure]) -> None:
    index: dict[tuple[str, str], list[Judged]] = {}
    for j in judged:
        index.setdefault((j.episode.chat, j.episode.status), []).append(j)
    for p in pages.values():
        if p.fired is None:
            continue
        owner = next(
            (
                j
                for j in index.get((p.chat, p.status), [])
                if any(_contains(s.entered, s.left, p.since) for s in j.episode.stays)
            ),
            None,
        )
        if owner is None:
            failures.append(
                Failure(
                    "false",
                    f"alert {p.fingerprint} (chat {p.chat[:8]} {p.status})",
                    f"its clock start {p.since:.3f} lies in no stay of that chat in {p.status}",
                )
            )
            continue
        owner.pages.append(p)


def _contains(entered: float, left: float | None, t: float) -> bool:
    return entered - EPSILON <= t and (left is None or t <= left + EPSILON)


def _check(j: Judged, line: Timeline, end: float, v: Verdict, *, start: float) -> None:
    """One episode's pages and resolves against its class and deadlines."""
    failures = v.failures
    ep = j.episode
    name = j.describe(start)
    fired = [p for p in j.pages if p.fired is not None]
    if j.verdict == "should" and not fired:  # owed by its deadline, which is within the run
        failures.append(
            Failure(
                "missed",
                name,
                f"no page within {j.deadline - ep.entered_wall:.1f}s of entering (its deadline)",
            )
        )
    for p in fired:
        assert p.fired is not None
        early = p.fired < j.due_lo_wall - j.early
        if not early and j.verdict != "must-not":
            continue
        why = (
            f"paged {j.due_lo_wall - p.fired:.1f}s before its budget (tolerance {j.early:g}s)"
            if early
            else "paged"
        )
        if j.verdict == "must-not":
            why += f"; it lasted only {(ep.left_wall or end) - ep.entered_wall:.1f}s"
        failures.append(Failure("false", name, why))
    if fired:
        first = min(p.fired for p in fired if p.fired is not None)
        if first > j.deadline:
            failures.append(
                Failure("late", name, f"paged {first - j.deadline:.1f}s after its deadline")
            )
        elif j.verdict == "should":
            v.page_latency.append(first - j.due_hi_wall)
    per_stay = Counter(
        next(i for i, s in enumerate(ep.stays) if _contains(s.entered, s.left, p.since))
        for p in fired
    )
    if any(n > 1 for n in per_stay.values()):
        fps = ", ".join(p.fingerprint for p in fired)
        failures.append(Failure("duplicate", name, f"paged under {len(fired)} alerts ({fps})"))
    for p in fired:
        if p.refired:
            failures.append(
                Failure("duplicate", name, f"alert {p.fingerprint} firing again after its resolve")
            )
        _check_resolve(j, p, line, end, v, episode=name)


def _check_resolve(
    j: Judged, p: Page, line: Timeline, end: float, v: Verdict, *, episode: str
) -> None:
    """A paged alert resolves after its chat left, and in time."""
    failures = v.failures
    ep = j.episode
    name = f"{episode} alert {p.fingerprint}"
    earliest = ep.first.left_wall
    if p.resolved is not None and (earliest is None or p.resolved < earliest - EPSILON):
        still = (
            "still in it at the end" if earliest is None else f"{earliest - p.resolved:.1f}s before"
        )
        failures.append(Failure("false resolve", name, f"resolved while in {ep.status} ({still})"))
        return
    if ep.left_wall is None:
        return
    last = ep.last
    gone = last.exit in ("archived", "deleted")
    owed = line.tol.resolve(heard=last.exit_heard, gone=gone)
    due = line.extend(ep.left_wall, owed, last.user)
    if p.resolved is None:
        if due <= end:
            how = "heard" if last.exit_heard else "unheard"
            failures.append(
                Failure("missing resolve", name, f"left ({last.exit}, {how}); never resolved")
            )
        else:
            v.notes["resolves not yet due at the end"] += 1
    elif p.resolved > due:
        failures.append(
            Failure("late", name, f"resolved {p.resolved - due:.1f}s after its resolve deadline")
        )
    else:
        v.resolve_latency.append(p.resolved - ep.left_wall)


def _dedup(run: Run, failures: list[Failure], tol: Tolerances, notes: Counter[str]) -> None:
    """Group notifications that told the receiver nothing new, before repeat_interval."""
    kills = [k for k, _ in run.kills]
    for key, prev, wall in unchanged(run):
        if wall - prev >= tol.repeat_min - tol.flush_max:
            notes["repeats"] += 1
        elif any(prev <= k <= min(wall, prev + tol.persist) for k in kills):
            # Killed between the send and its record (committed at once after the answer).
            notes["re-sent after a kill -9"] += 1
        else:
            failures.append(
                Failure(
                    "duplicate",
                    f"group {key}",
                    f"notified again after {wall - prev:.1f}s with nothing new",
                )
            )


def _harness(run: Run, failures: list[Failure]) -> None:
    """What is not watchd's verdicts but fails the run all the same."""
    for why in run.rejected:
        failures.append(Failure("other", "notification", f"refused by the receiver: {why}"))
    for crash in run.crashes:
        failures.append(Failure("other", "daemon", f"exited by itself: {crash}"))
    if run.journal_dropped:
        failures.append(Failure("other", "history", f"{run.journal_dropped} entries dropped"))
    # The journal must account for every chat's final state (nothing moved behind it).
    last: dict[str, tuple[str, float, bool]] = {}
    for e in run.journal:
        if e.get("chat") and e["kind"] != "deleted":
            last[e["chat"]] = (e["status"], e["updated_at"], e["archived"])
    for c in run.final_chats:
        if last.get(c["id"]) != (c["status"], c["updated_at"], c["archived"]):
            failures.append(
                Failure("other", f"chat {c['id'][:8]}", "the journal does not explain its state")
            )


def main(argv: list[str]) -> int:
    """Judge a saved run again: ``python -m tests.soak.oracle run.json``."""
    from tests.soak.table import summary

    verdict = judge(Run.load(Path(argv[1])))
    print(summary(verdict))
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
