"""The cyclic garbage collector, paused for a burst of short-lived acyclic objects.

A burst (ten thousand alerts fired in one pass, their webhook body built) allocates
tens of thousands of dicts and strings at once; the collector would rescan the whole
heap several times meanwhile, though none of them can be part of a cycle.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused(when: bool = True) -> Iterator[None]:
    """The cyclic collector off inside the block (when ``when`` and it was on), back on
    after it, however the block ends."""
    pause = when and gc.isenabled()
    if pause:
        gc.disable()
    try:
        yield
    finally:
        if pause:
            gc.enable()
