"""The soak's summary: what ran, the episodes by class, the failures by kind (each named),
latencies, and the tolerances the verdicts used — as text, and as JSON beside it."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from tests.soak.oracle import KINDS, Verdict
from tests.soak.shape import WATCHED

CLASSES = ("should", "grey", "must-not", "unjudged")
CLASS_NAMES = {
    "should": "should page",
    "grey": "grey zone",
    "must-not": "must not page",
    "unjudged": "unjudged (open at the end)",
}
SHOWN = 60  # failures listed by name; the rest are counted


def _spread(values: list[float]) -> str:
    if not values:
        return "none"
    q = statistics.quantiles(values, n=20) if len(values) > 1 else [values[0]] * 19
    return (
        f"median {statistics.median(values):.2f}, p95 {q[18]:.2f}, max {max(values):.2f} "
        f"(n={len(values)})"
    )


def _clock_starts(v: Verdict) -> dict[str, int]:
    """How the pages' clock starts compare with the stays they belong to: at the entry
    itself (to the millisecond), or later (a lower bound: the entry went unseen)."""
    out = {"exact": 0, "exact_heard": 0, "later": 0, "later_heard": 0}
    for j in v.judged:
        for p in j.pages:
            if p.fired is None:
                continue
            # Its stay: the last one entered by its clock start (the oracle put it there).
            stay = [s for s in j.episode.stays if s.entered - 0.002 <= p.since][-1]
            kind = "exact" if abs(p.since - stay.entered) < 0.001 else "later"
            out[kind] += 1
            if stay.entry_heard:
                out[f"{kind}_heard"] += 1
    return out


def facts(v: Verdict) -> dict[str, Any]:
    """The figures the summary prints, as plain data (saved as JSON)."""
    run = v.run
    moves = [e for e in run.journal if e["kind"] == "status"]
    by_class: dict[str, Counter[str]] = {c: Counter() for c in CLASSES}
    for j in v.judged:
        by_class[j.verdict][j.episode.status] += 1
    return {
        "seed": run.seed,
        "minutes": run.minutes,
        "identities": len(run.identities),
        "chats": sum(1 for e in run.journal if e["kind"] == "created"),
        "moves": len(moves),
        "silent": sum(1 for e in moves if e["silent"]),
        "unheard": sum(1 for e in moves if not e["heard"]),
        "step_commits": sum(1 for e in run.journal if e["kind"] == "bumped"),
        "archived": sum(1 for e in run.journal if e["kind"] == "archived"),
        "deleted": sum(1 for e in run.journal if e["kind"] == "deleted"),
        "actions": dict(run.actions),
        "reloads_changing_config": sum(
            1 for a, b in zip(run.configs, run.configs[1:], strict=False) if a[1] != b[1]
        ),
        "notifications": len(run.deliveries),
        "refused_while_down": run.refused,
        "episodes": {c: dict(by_class[c]) for c in CLASSES},
        "merged": sum(1 for j in v.judged if len(j.episode.stays) > 1),
        "paged": sum(1 for j in v.judged if any(p.fired is not None for p in j.pages)),
        "clock_starts": _clock_starts(v),
        "failures": {k: v.count(k) for k in KINDS},
        "failure_list": [str(f) for f in v.failures],
        "notes": dict(v.notes),
        "page_latency": sorted(v.page_latency),
        "resolve_latency": sorted(v.resolve_latency),
        "tolerances": v.tol.statement(),
    }


def summary(v: Verdict) -> str:
    f = facts(v)
    a = f["actions"]
    lines = [
        f"watchd soak: seed {f['seed']}, {f['minutes']:g} min, {f['identities']} identities, "
        f"{f['chats']} chats ({f['archived']} archived, {f['deleted']} deleted)",
        f"  moves {f['moves']} ({f['silent']} without their event, {f['unheard']} unheard), "
        f"step commits {f['step_commits']}",
        f"  kill -9 {a.get('kill', 0)}, SIGHUP {a.get('sighup', 0)} "
        f"({f['reloads_changing_config']} changed the config), receiver outages "
        f"{a.get('receiver_down', 0)}, Coder error windows {a.get('coder_errors', 0)}, "
        f"429 windows {a.get('throttle', 0)}, Coder restarts {a.get('sim_restart', 0)}, "
        f"socket drops {a.get('drop_watch', 0)}, clock steps {a.get('clock', 0)}",
        f"  notifications {f['notifications']} accepted, {f['refused_while_down']} refused "
        f"while the receiver was down; {f['paged']} episodes paged",
        f"  clock starts of the pages: {f['clock_starts']['exact']} at the entry to the "
        f"millisecond ({f['clock_starts']['exact_heard']} of them heard), "
        f"{f['clock_starts']['later']} later (the entry unseen: a lower bound; "
        f"{f['clock_starts']['later_heard']} with the entry heard)",
        "",
        f"  {'episodes':<28}" + "".join(f"{s:>17}" for s in WATCHED) + f"{'total':>9}",
    ]
    for c in CLASSES:
        row = f["episodes"][c]
        lines.append(
            f"  {CLASS_NAMES[c]:<28}"
            + "".join(f"{row.get(s, 0):>17}" for s in WATCHED)
            + f"{sum(row.values()):>9}"
        )
    lines.append(f"  {'(of which merged stays)':<28}{f['merged']:>17}")
    lines += ["", f"  {'failures':<28}{'count':>9}"]
    lines += [f"  {k:<28}{n:>9}" for k, n in f["failures"].items()]
    lines += [
        "",
        f"  page latency after due (s):   {_spread(v.page_latency)}",
        f"  resolve after leaving (s):    {_spread(v.resolve_latency)}",
    ]
    if f["notes"]:
        lines.append("  notes: " + ", ".join(f"{k} {n}" for k, n in sorted(f["notes"].items())))
    lines += ["", "  tolerances:"] + [f"    {t}" for t in f["tolerances"]]
    if v.failures:
        lines += ["", f"  FAILED ({len(v.failures)}):"]
        lines += [f"    {x}" for x in f["failure_list"][:SHOWN]]
        if len(v.failures) > SHOWN:
            lines.append(f"    … and {len(v.failures) - SHOWN} more (see the JSON)")
    else:
        lines += ["", "  PASSED: no missed, false, duplicate, late or missing-resolve episode"]
    return "\n".join(lines)
