"""Everything a soak run leaves for the oracle, as plain data (saved as JSON beside the
summary, so a run can be judged again: ``python -m tests.soak.oracle run.json``).

Times named ``wall`` are the host's clock (the simulator, the receiver and the driver
share the host); the simulator's journal also carries its own server time ``at``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Run:
    seed: int
    minutes: float
    identities: dict[str, str]  # username → identity name
    variants: list[dict[str, Any]]  # the config variants (tests.soak.shape.Variant.as_dict)
    budget_scale: float  # watchd's budgets ÷ the oracle's (1 unless proving it fails)
    max_clock_step: float
    receiver_retry_after: float
    started: float  # wall: the schedule's zero
    ended: float  # wall: the last move (every chat left its watched status)
    observed_until: float  # wall: the daemon was stopped
    journal: list[dict[str, Any]] = field(default_factory=list)  # the simulator's history
    journal_dropped: int = 0
    # Per username, [wall start, wall end) with no watch socket open (sim-side).
    watch_gaps: dict[str, list[list[float]]] = field(default_factory=dict)
    kills: list[list[float]] = field(default_factory=list)  # [wall killed, wall started]
    configs: list[list[float]] = field(default_factory=list)  # [wall, variant] in force from
    receiver_outages: list[list[Any]] = field(default_factory=list)  # [wall, wall, mode]
    deliveries: list[list[Any]] = field(default_factory=list)  # [wall arrived, webhook body]
    refused: int = 0
    rejected: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)  # unexpected daemon exits, with why
    final_chats: list[dict[str, Any]] = field(default_factory=list)  # /__sim/state at the end
    actions: dict[str, int] = field(default_factory=dict)  # how many of each kind ran

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> Run:
        return cls(**json.loads(path.read_text()))
