"""Which build this is: the version and the source revision it was built from.

The revision comes from ``watchd/REVISION`` when a build wrote it (the Dockerfile's
``REVISION`` build argument, ``make revision``), else from the git checkout the package
runs from (read from ``.git`` directly: no ``git`` binary needed), else ``unknown``.
Read once, at first use: ``watchd --version`` and ``watchd_build_info{revision}``.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from watchd import __version__

PACKAGE = Path(__file__).resolve().parent
_SHA = re.compile(r"^[0-9a-f]{7,64}$")


@functools.cache
def revision() -> str:
    written = PACKAGE / "REVISION"
    try:
        text = written.read_text().strip()
    except OSError:
        text = ""
    if _SHA.match(text):
        return text
    return _from_git(PACKAGE.parent / ".git") or "unknown"


def _from_git(git: Path) -> str:
    """HEAD's commit of a checkout (a worktree's ``.git`` file followed), or ""."""
    try:
        if git.is_file():  # a worktree: "gitdir: /path/to/.git/worktrees/name"
            git = Path(git.read_text().split(":", 1)[1].strip())
        head = (git / "HEAD").read_text().strip()
        if _SHA.match(head):
            return head
        ref = head.removeprefix("ref: ").strip()
        common = git
        if (git / "commondir").is_file():
            common = (git / (git / "commondir").read_text().strip()).resolve()
        for base in (git, common):
            loose = base / ref
            if loose.is_file():
                sha = loose.read_text().strip()
                return sha if _SHA.match(sha) else ""
        packed = common / "packed-refs"
        for line in packed.read_text().splitlines() if packed.is_file() else ():
            sha, _, name = line.partition(" ")
            if name.strip() == ref and _SHA.match(sha):
                return sha
    except (OSError, IndexError, ValueError):
        return ""
    return ""


def version_line() -> str:
    return f"watchd {__version__} (revision {revision()[:12]})"
