"""Real-system tests: skipped only where this machine cannot run them, saying why."""

from __future__ import annotations

import os
import shutil

import pytest


def skip_unless(*, root: bool = False, tools: tuple[str, ...] = ()) -> pytest.MarkDecorator:
    """A skip mark for a machine without root or without one of ``tools``."""
    missing = [t for t in tools if shutil.which(t) is None]
    if root and os.geteuid() != 0:
        return pytest.mark.skip(reason="needs root (mounts, uid switches, containers)")
    if missing:
        return pytest.mark.skip(reason=f"not on this machine: {', '.join(missing)}")
    return pytest.mark.skipif(False, reason="")
