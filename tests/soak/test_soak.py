"""The project's randomized soak: the real daemon against the simulator under continuous
motion and faults, judged by the oracle (docs/testing.md).

``make soak MINUTES=30 SEED=2`` for a long run; ``make test`` runs 2 minutes of seed 1.
Environment: ``SOAK_MINUTES``, ``SOAK_SEED``, ``SOAK_RESULTS`` (a directory for
``run.json``, ``summary.txt`` and ``summary.json``; default: the test's temporary
directory), and to watch the oracle fail on purpose, ``SOAK_BUDGET_SCALE`` (watchd's
budgets ÷ the oracle's) and ``SOAK_DROP_EVERY_OTHER=1`` (a receiver that loses every
second notification).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.soak.driver import Soak
from tests.soak.oracle import Verdict, judge
from tests.soak.record import Run
from tests.soak.schedule import plan
from tests.soak.shape import VARIANTS, Shape
from tests.soak.table import facts, summary
from tests.soak.tolerances import Tolerances

MINUTES = float(os.environ.get("SOAK_MINUTES", "2"))
SEED = int(os.environ.get("SOAK_SEED", "1"))


@pytest.mark.timeout(MINUTES * 60 + 600)
async def test_soak_pages_each_stuck_episode_once_in_time_and_nothing_else(
    tmp_path: Path,
) -> None:
    """Under status motion with and without events, deletes, archives, socket drops,
    5xx/429, clock steps, receiver outages, kill -9 and SIGHUP, watchd misses no page,
    sends no false, duplicate or late one, and resolves every page it sent."""
    shape = Shape.of(MINUTES)
    tol = Tolerances.of(
        VARIANTS,
        max_clock_step=shape.max_clock_step,
        receiver_retry_after=shape.receiver_retry_after,
    )
    soak = Soak(
        tmp_path,
        seed=SEED,
        shape=shape,
        variants=VARIANTS,
        tol=tol,
        actions=plan(SEED, shape, VARIANTS, tol),
        budget_scale=float(os.environ.get("SOAK_BUDGET_SCALE", "1")),
        drop_every_other=os.environ.get("SOAK_DROP_EVERY_OTHER") == "1",
    )
    run = await soak.run()
    verdict = judge(run)
    text = summary(verdict)
    out = _save(Path(os.environ.get("SOAK_RESULTS") or tmp_path), run, verdict, text)
    print(f"\n{text}\n(run, daemon logs: {tmp_path}; summary: {out})")
    assert verdict.ok, text


def _save(out: Path, run: Run, verdict: Verdict, text: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    run.save(out / "run.json")
    (out / "summary.txt").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps(facts(verdict), indent=1))
    return out
