"""One daemon per state directory: an exclusive lock held for the process's life.

Two daemons on one ``state_dir`` both ran (and paged every group interval, and lost a
resolve between them). ``flock`` is released by the kernel when the holder dies, even by
``kill -9``, so a crashed daemon never blocks its successor.

The lock is taken on the state directory itself, not only on a file in it: a lock file
can be unlinked beneath a running daemon (``rm watchd.lock``), after which a second one
would create a fresh file, lock that and start; the directory cannot be replaced while
it holds the database. ``watchd.lock`` is still locked too (a daemon from before this
change locks only the file) and names the holder's pid for the one that is refused. This
module must not decide anything about what lives in the directory.
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
    def __init__(self, path: Path, fds: tuple[int, ...]) -> None:
        self.path = path
        self._fds = fds

    @classmethod
    def acquire(cls, directory: Path) -> StateLock:
        """Lock ``directory`` (created if missing) or raise :class:`StateInUse`."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / LOCK_NAME
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except BaseException:
            os.close(dir_fd)
            raise
        try:
            for locked in (dir_fd, fd):
                fcntl.flock(locked, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            finally:
                os.close(fd)
                os.close(dir_fd)
            raise StateInUse(path, holder or "unknown") from None
        except BaseException:
            os.close(fd)
            os.close(dir_fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, (dir_fd, fd))

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)  # closing the descriptor drops its lock
        self._fds = ()
