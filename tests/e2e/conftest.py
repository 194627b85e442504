"""Fixtures that start and always stop the real processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import DaemonProcess, SimProcess


@pytest.fixture
def start_sim() -> Iterator[Callable[..., SimProcess]]:
    started: list[SimProcess] = []

    def start(**kw: Any) -> SimProcess:
        sim = SimProcess(**kw).start()
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    started: list[DaemonProcess] = []

    def start(
        sim: SimProcess, *, identities: list[tuple[str, str]] | None = None, **kw: Any
    ) -> DaemonProcess:
        d = DaemonProcess(tmp_path, sim, identities=identities or [("team-a", "alice")], **kw)
        d.start()
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()
