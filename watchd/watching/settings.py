"""A watcher's tunables: intervals, backoff, buffers, the fallback to polling.

Plain frozen data with the defaults a daemon runs with; the daemon takes the
reconcile interval from the config, tests and the demo pass their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from watchd.coder.watchstream import DEFAULT_HEARTBEAT


@dataclass(frozen=True)
class WatchSettings:
    reconcile_interval: float = 60.0
    heartbeat: float = DEFAULT_HEARTBEAT
    backoff_base: float = 1.0
    backoff_cap: float = 30.0
    # A connection that lived this long proves the path works: the backoff resets.
    healthy_after: float = 30.0
    auth_retry: float = 300.0
    # GETs per second confirming chats a listing lacked.
    absent_confirm_rate: float = 4.0
    # A refused token (401/403) is tried once more after this long before it counts as
    # refused: a proxy hiccup or a rotation mid-flight can refuse once.
    auth_confirm_after: float = 5.0
    # Events buffered while a listing runs; past this only the ids of the chats they were
    # about are kept (as Coder's web client does) and re-read once the listing is applied.
    buffer_limit: int = 20_000
    # Dirty chat ids kept past the buffer; past this the stream is dropped and relisted.
    dirty_limit: int = 200_000
    quota_ttl: float = 60.0
    # A watch stream refused this many times in a row while REST answers (a proxy that
    # will not upgrade): the identity is watched by listing every poll_interval instead,
    # trying the stream again after each listing.
    poll_after: int = 3
    poll_interval: float = 15.0
