"""The soak's oracle can fail: fed hand-made runs (tests.soak.synthetic), it passes a
correct watchd and names each kind of failure of a wrong one; and the schedule is the
seed's alone."""

from __future__ import annotations

from typing import Any

from tests.soak.oracle import Verdict, judge
from tests.soak.receiver import problem
from tests.soak.schedule import plan
from tests.soak.shape import VARIANTS, Shape
from tests.soak.synthetic import T0, Synthetic, iso
from tests.soak.table import summary
from tests.soak.tolerances import Tolerances


def fleet() -> Synthetic:
    """Episodes of every class (budgets: running 20 s, requires_action 25 s,
    interrupting 15 s)."""
    s = Synthetic(minutes=5)
    s.chat([(10, "running"), (60, "waiting")])  # 50 s: should page
    s.chat([(10, "running"), (15, "waiting")])  # 5 s: must not
    s.chat([(20, "requires_action"), (80, "running"), (90, "waiting")])  # should, then must not
    s.chat([(30, "interrupting"), (47, "waiting")])  # 17 s of 15: grey
    s.chat([(100, "running"), (200, "waiting")])  # should
    s.chat([(5, "running"), (12, "waiting"), (40, "running"), (100, "waiting")])
    s.chat([(150, "running"), (167, "waiting")])  # 17 s of 20: must not
    return s


def kinds(v: Verdict) -> set[str]:
    return {f.kind for f in v.failures}


def classes(v: Verdict) -> dict[str, int]:
    out: dict[str, int] = {}
    for j in v.judged:
        out[j.verdict] = out.get(j.verdict, 0) + 1
    return out


def test_a_correct_watchd_passes_with_every_class_of_episode() -> None:
    """Pages half a second after due and resolves half a second after leaving: no failure,
    and the fleet has should-page, grey and must-not-page episodes."""
    v = judge(fleet().run())
    assert v.ok, summary(v)
    assert classes(v) == {"should": 4, "must-not": 4, "grey": 1}
    assert "PASSED" in summary(v)


def test_a_receiver_that_drops_every_other_notification_fails_the_oracle() -> None:
    """Losing every second notification is seen: pages missed or late, resolves missing,
    each failure naming the chat's episode."""
    s = fleet()
    v = judge(s.run(s.notifications()[::2]))
    assert not v.ok
    assert kinds(v) <= {"missed", "late", "missing resolve"} and kinds(v) & {
        "missed",
        "missing resolve",
    }
    assert all(f.what.startswith("chat ") for f in v.failures)
    assert "FAILED" in summary(v)


def test_budgets_shorter_than_the_oracles_fail_it() -> None:
    """A watchd whose budgets are 0.7 × the oracle's pages before due and pages an episode
    that must not page: false pages."""
    s = fleet()
    v = judge(s.run(s.notifications(budget_scale=0.7)))
    assert "false" in kinds(v)
    assert any("before its budget" in f.why for f in v.failures)
    assert any("lasted only" in f.why for f in v.failures)


def one_chat(moves: list[tuple[float, str]], **kw: Any) -> tuple[Synthetic, str]:
    s = Synthetic(minutes=5)
    return s, s.chat(moves, **kw)


def test_a_late_page_and_a_late_resolve_are_late() -> None:
    """A page 30 s after due and a resolve 40 s after the chat left are late."""
    s, chat = one_chat([(10, "running"), (100, "waiting")])
    a = s.alert(chat, "running", T0 + 10)
    v = judge(s.run(s.grouped([(T0 + 60, "firing", a), (T0 + 140, "resolved", a)])))
    assert [f.kind for f in v.failures] == ["late", "late"]
    assert "after its deadline" in v.failures[0].why
    assert "after its resolve deadline" in v.failures[1].why


def test_no_page_is_missed_and_no_resolve_is_a_missing_resolve() -> None:
    """Nothing sent for a 90 s stay is a miss; a page never resolved is a missing resolve."""
    s, chat = one_chat([(10, "running"), (100, "waiting")])
    assert [f.kind for f in judge(s.run([])).failures] == ["missed"]
    a = s.alert(chat, "running", T0 + 10)
    v = judge(s.run(s.grouped([(T0 + 31, "firing", a)])))
    assert [f.kind for f in v.failures] == ["missing resolve"]


def test_two_alerts_for_one_stay_and_a_refire_are_duplicates() -> None:
    """One stay paged under two fingerprints, and an alert firing again after its resolve
    was delivered, are duplicates."""
    s, chat = one_chat([(10, "running"), (100, "waiting")])
    a = s.alert(chat, "running", T0 + 10)
    b = s.alert(chat, "running", T0 + 12)
    v = judge(
        s.run(
            s.grouped(
                [
                    (T0 + 31, "firing", a),
                    (T0 + 32, "firing", b),
                    (T0 + 101, "resolved", a),
                    (T0 + 101, "resolved", b),
                ]
            )
        )
    )
    assert [f.kind for f in v.failures] == ["duplicate"]
    assert "2 alerts" in v.failures[0].why
    events = [(T0 + 31, "firing", a), (T0 + 50, "resolved", a), (T0 + 60, "firing", a)]
    v = judge(s.run(s.grouped(events)))
    assert any("firing again after its resolve" in f.why for f in v.failures)


def test_a_group_renotified_with_nothing_new_is_a_duplicate_unless_killed_right_after() -> None:
    """The same notification again 2 s later breaks Alertmanager's dedup; after a kill -9
    right after the first send it is the one re-send the spec allows, after a later one
    it is not."""
    s, _ = one_chat([(10, "running"), (100, "waiting")])
    notes = s.notifications()
    first = notes[0]
    again = [[first[0] + 2.0, first[1]]]
    v = judge(s.run([first, *again, *notes[1:]]))
    assert [(f.kind, f.what.split(" ")[0]) for f in v.failures] == [("duplicate", "group")]
    run = s.run([first, *again, *notes[1:]])
    run.kills = [[first[0] + 0.1, first[0] + 1.5]]
    assert judge(run).ok
    run.kills = [[first[0] + 1.5, first[0] + 1.8]]  # it had been recorded: no excuse
    assert not judge(run).ok


def test_a_resolve_before_leaving_and_a_page_of_no_stay_are_false() -> None:
    """A resolve delivered while the chat is still running is a false resolve; a page whose
    clock start falls in no stay of that status is a false page."""
    s, chat = one_chat([(10, "running"), (100, "waiting")])
    a = s.alert(chat, "running", T0 + 10)
    v = judge(s.run(s.grouped([(T0 + 31, "firing", a), (T0 + 70, "resolved", a)])))
    assert [f.kind for f in v.failures] == ["false resolve"]
    ghost = s.alert(chat, "running", T0 + 5)  # before the chat existed
    events = [(T0 + 31, "firing", a), (T0 + 40, "firing", ghost), (T0 + 101, "resolved", a)]
    v = judge(s.run(s.grouped(events)))
    assert "false" in kinds(v) and any("lies in no stay" in f.why for f in v.failures)


def test_blind_time_moves_a_deadline_by_its_length_and_recovery() -> None:
    """A page 25 s after due is late, unless the receiver was down from due for 20 s."""
    s, chat = one_chat([(10, "running"), (200, "waiting")])
    a = s.alert(chat, "running", T0 + 10)
    events = [(T0 + 55, "firing", a), (T0 + 201, "resolved", a)]
    assert [f.kind for f in judge(s.run(s.grouped(events))).failures] == ["late"]
    run = s.run(s.grouped(events))
    run.receiver_outages = [[T0 + 30, T0 + 50, "503"]]
    assert judge(run).ok


def test_stays_watchd_cannot_tell_apart_are_one_episode() -> None:
    """running, a silent move to waiting and a silent one back 2 s later: watchd may keep
    the first clock, so a page on it is no false page; with 30 s between, a listing must
    have seen the gap, and the same page is false."""
    s, chat = one_chat(
        [(10, "running"), (12, "waiting"), (14, "running"), (80, "waiting")], unheard=(1, 2)
    )
    first_clock = s.alert(chat, "running", T0 + 10)
    events = [(T0 + 31, "firing", first_clock), (T0 + 81, "resolved", first_clock)]
    v = judge(s.run(s.grouped(events)))
    assert v.ok, summary(v)
    assert [len(j.episode.stays) for j in v.judged] == [2]
    s, chat = one_chat(
        [(10, "running"), (12, "waiting"), (42, "running"), (100, "waiting")], unheard=(1, 2)
    )
    first_clock = s.alert(chat, "running", T0 + 10)
    events = [(T0 + 31, "firing", first_clock), (T0 + 101, "resolved", first_clock)]
    assert "false" in kinds(judge(s.run(s.grouped(events))))


def test_the_schedule_is_the_seeds_and_holds_every_fault() -> None:
    """The same seed gives the same actions, another seed others; even 2 minutes hold each
    kind of fault; a silent exit is never followed by a silent re-entry within a listing."""
    shape = Shape.of(2)
    tol = Tolerances.of(VARIANTS, max_clock_step=3.0, receiver_retry_after=2.0)
    one = plan(1, shape, VARIANTS, tol)
    assert one == plan(1, shape, VARIANTS, tol) and one != plan(2, shape, VARIANTS, tol)
    kinds_run = {a.kind for a in one}
    assert kinds_run >= {
        "kill",
        "start",
        "sighup",
        "receiver_down",
        "coder_errors",
        "throttle",
        "sim_restart",
        "drop_watch",
        "clock",
        "archive",
        "bump",
    }
    assert any(a.silent for a in one) and any(not a.silent for a in one if a.kind == "move")


def test_the_receiver_refuses_a_payload_that_breaks_the_webhook_contract() -> None:
    """A well-formed v4 body passes; a resolved alert without endsAt does not."""
    alert = {
        "status": "firing",
        "labels": {},
        "annotations": {},
        "startsAt": iso(T0),
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "",
        "fingerprint": "f",
    }
    body = {
        "version": "4",
        "groupKey": "k",
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "soak",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "",
        "alerts": [alert],
    }
    assert problem(body) == ""
    bad = {**body, "status": "resolved", "alerts": [{**alert, "status": "resolved"}]}
    assert "endsAt" in problem(bad)
