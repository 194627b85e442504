"""What ``run`` would die on, checked before it starts: the state directory and the
listen address.

``check-config`` reports these as problems; ``run`` turns them (and the same
failures if they happen anyway, in a race) into one line naming the setting and
exit 2 — an operator's mistake never reaches them as a traceback. Nothing here
keeps a resource: the probe socket is closed, the probe file removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sqlite3
import tempfile
from pathlib import Path

from watchd.store.lock import StateInUse, StateLock
from watchd.store.sqlite import StateFile


def effective_state_dir(configured: str) -> Path:
    """``$STATE_DIRECTORY`` (systemd's StateDirectory=) wins over the config's state_dir."""
    return Path(os.environ.get("STATE_DIRECTORY", "").split(":")[0] or configured)


class StartupError(Exception):
    """An operator-fixable reason the daemon cannot start; the message names the setting."""


def open_state(directory: Path) -> tuple[StateLock, StateFile]:
    """Lock ``state_dir`` (one daemon per directory) and open its database, or a
    StartupError naming ``state_dir`` and why."""
    try:
        lock = StateLock.acquire(directory)
    except StateInUse as exc:
        raise StartupError(f"state_dir: {exc}") from None
    except OSError as exc:
        raise StartupError(f"state_dir: cannot lock {directory} ({exc})") from None
    try:
        db = StateFile.open(directory / "watchd.sqlite3")
    except (OSError, sqlite3.Error) as exc:
        lock.release()
        raise StartupError(
            f"state_dir: cannot open {directory / 'watchd.sqlite3'} ({exc})"
        ) from None
    return lock, db


def check_state_dir(path: Path, *, setting: str = "state_dir") -> str | None:
    """None when the directory is writable, or can be created. Checked by trying (as root,
    ``os.access`` says yes to ``/proc/…``), and what the try made is removed again:
    ``check-config`` has no side effects; ``run`` creates the directory."""
    if not path.exists():
        missing = []
        parent = path
        while not parent.exists() and parent != parent.parent:
            missing.append(parent)
            parent = parent.parent
        if not parent.is_dir():
            return f"{setting}: cannot create {path} ({parent} is not a directory)"
        made: list[Path] = []
        try:
            for d in reversed(missing):
                d.mkdir()
                made.append(d)
            with tempfile.NamedTemporaryFile(dir=path, prefix=".watchd-probe-"):
                pass
        except OSError as exc:
            return f"{setting}: cannot create {path} ({exc.strerror or type(exc).__name__})"
        finally:
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    d.rmdir()
        return None
    if not path.is_dir():
        return f"{setting}: {path} is not a directory"
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".watchd-probe-"):
            pass
    except OSError as exc:
        return f"{setting}: {path} is not writable ({exc.strerror or type(exc).__name__})"
    db = path / "watchd.sqlite3"
    if db.exists() and not os.access(db, os.R_OK | os.W_OK):
        return f"{setting}: {db} exists but is not readable and writable by this user"
    return None


def check_listen(listen: str, *, setting: str = "server.listen") -> str | None:
    """None when ``HOST:PORT`` can be bound now (port 0 always can)."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(
            host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (OSError, ValueError) as exc:
        return f"{setting}: cannot resolve {listen} ({exc})"
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        # aiohttp sets SO_REUSEADDR too: a port in TIME_WAIT is not "in use".
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            return bind_problem(listen, exc, setting=setting)
    return None


def bind_problem(listen: str, exc: OSError, *, setting: str = "server.listen") -> str:
    """One line for a failed bind, naming the setting and the address."""
    if exc.errno == errno.EADDRINUSE:
        return f"{setting}: {listen} is already in use (another watchd, or another program)"
    if exc.errno == errno.EACCES:
        return f"{setting}: {listen}: permission denied (ports below 1024 need privileges)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{setting}: {listen}: no such local address on this host"
    return f"{setting}: cannot listen on {listen} ({exc.strerror or type(exc).__name__})"
