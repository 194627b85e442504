"""Who watches which identity: rendezvous (highest-random-weight) hashing.

Pure. Every replica scores every (identity, replica) pair with the same hash and
an identity belongs to the ``factor`` replicas with the highest scores. No
replica talks to another: all of them compute the same table from the same
config. Growing from N to N+1 replicas moves only the identities whose top
scores now include the new replica — about ``factor/(N+1)`` of them — and
nothing moves between the old replicas.

The replica's own index comes from the config, or from a StatefulSet pod's
ordinal: its hostname (``watchd-2``) or the Downward API's ``POD_NAME``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping

_ORDINAL = re.compile(r"-(\d+)$")


def score(identity: str, replica: int) -> int:
    """The identity's weight at ``replica``: a 64-bit slice of SHA-256, stable across
    Python versions and processes (unlike ``hash()``)."""
    digest = hashlib.sha256(f"{identity}\x00{replica}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def owners(identity: str, *, replicas: int, factor: int = 1) -> list[int]:
    """The replicas that own ``identity``, highest weight first."""
    if replicas < 1 or not 1 <= factor <= replicas:
        raise ValueError(f"need 1 ≤ factor ({factor}) ≤ replicas ({replicas})")
    ranked = sorted(range(replicas), key=lambda r: (score(identity, r), r), reverse=True)
    return ranked[:factor]


def assignment(
    identities: Iterable[str], *, replicas: int, factor: int = 1
) -> dict[str, list[int]]:
    """identity → the replicas that own it."""
    return {name: owners(name, replicas=replicas, factor=factor) for name in identities}


def owned_by(table: Mapping[str, list[int]], replica: int) -> list[str]:
    """The identities ``replica`` owns in an :func:`assignment` table."""
    return [name for name, reps in table.items() if replica in reps]


def ordinal(name: str) -> int | None:
    """A StatefulSet pod's ordinal from its name (``watchd-2`` → 2), else None."""
    m = _ORDINAL.search(name.strip().split(".", 1)[0])
    return int(m.group(1)) if m else None
