"""Real-system tests: skipped only where this machine cannot run them, saying why; and
all of them on one pytest-xdist worker, in file order, when `make test` runs them beside
the end-to-end tests."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest
from xdist.scheduler import LoadGroupScheduling

HERE = "tests/system/"


class SystemTestsOnOneWorker(LoadGroupScheduling):
    """``--dist loadgroup`` with every test under tests/system/ in one group.

    The modules share a Docker engine or a booted machine through module fixtures and run
    in file order; a second engine or machine at once would only double the heaviest load
    while the end-to-end tests, which time real processes, run on the other worker. The
    group is the path, not an ``xdist_group`` mark: on pytest 9.2 xdist's marks are
    silently dropped (it renames node ids, which pytest no longer lets it do)."""

    def _split_scope(self, nodeid: str) -> str:
        return HERE if nodeid.startswith(HERE) else super()._split_scope(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadGroupScheduling | None:
    """The scheduler for ``-n N --dist loadgroup`` runs that include tests/system."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return SystemTestsOnOneWorker(config, log)


def skip_unless(*, root: bool = False, tools: tuple[str, ...] = ()) -> pytest.MarkDecorator:
    """A skip mark for a machine without root or without one of ``tools``."""
    missing = [t for t in tools if shutil.which(t) is None]
    if root and os.geteuid() != 0:
        return pytest.mark.skip(reason="needs root (mounts, uid switches, containers)")
    if missing:
        return pytest.mark.skip(reason=f"not on this machine: {', '.join(missing)}")
    return pytest.mark.skipif(False, reason="")
