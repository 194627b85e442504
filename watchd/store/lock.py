"""One daemon per state directory: an exclusive lock held for the process's life.

Two daemons on one ``state_dir`` both ran (and paged every group interval, and lost a
resolve between them). ``flock`` is released by the kernel when the holder dies, even by
``kill -9``, so a crashed daemon never blocks its successor; the lock file names the
holder's pid for the one that is refused.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = "watchd.lock"


class StateInUse(Exception):
    """Another live process holds the state directory."""

    def __init__(self, path: Path, holder: str) -> None:
        self.path = path
        self.holder = holder
        super().__init__(f"{path.parent} is in use by another watchd (pid {holder})")


class StateLock:
    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, directory: Path) -> StateLock:
        """Lock ``directory`` (created if missing) or raise :class:`StateInUse`."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            finally:
                os.close(fd)
            raise StateInUse(path, holder or "unknown") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None
