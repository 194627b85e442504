"""Reading secrets given by reference: a file, an environment variable, or a
systemd credential name resolved under ``$CREDENTIALS_DIRECTORY``.

Errors name the reference (path, variable, credential), never the content.
Every secret read is registered with :data:`watchd.kits.redaction.REGISTRY`
so the log pipeline can scrub it from any line as a last line of defence.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from watchd.kits.redaction import REGISTRY


class SecretError(ValueError):
    """A secret reference that cannot be resolved; the message names the reference only."""


def read_secret_file(path: str | os.PathLike[str], *, what: str) -> str:
    """The stripped content of a secret file, refusing missing, empty and world-readable ones."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise SecretError(f"{what}: secret file {p} does not exist") from None
    except PermissionError:
        raise SecretError(f"{what}: secret file {p} is not readable by this user") from None
    if not stat.S_ISREG(st.st_mode):
        raise SecretError(f"{what}: secret file {p} is not a regular file")
    if st.st_mode & stat.S_IROTH:
        raise SecretError(
            f"{what}: secret file {p} is world-readable (mode {stat.S_IMODE(st.st_mode):o}); "
            "chmod o-r it"
        )
    try:
        value = p.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretError(
            f"{what}: secret file {p} cannot be read ({type(exc).__name__})"
        ) from None
    if not value:
        raise SecretError(f"{what}: secret file {p} is empty")
    REGISTRY.add(value)
    return value


def read_secret_env(name: str, *, what: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise SecretError(f"{what}: environment variable {name} is unset or empty")
    REGISTRY.add(value)
    return value


def read_credential(name: str, *, what: str) -> str:
    """A systemd credential (``LoadCredential=``) by name."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        raise SecretError(
            f"{what}: credential {name!r} requested but $CREDENTIALS_DIRECTORY is not set "
            "(not running under systemd with LoadCredential=?)"
        )
    if "/" in name or name in {".", ".."}:
        raise SecretError(f"{what}: credential name {name!r} is not a plain name")
    return read_secret_file(Path(directory) / name, what=what)


def resolve(*, file: str | None, env: str | None, credential: str | None, what: str) -> str:
    """Exactly one of file/env/credential, resolved."""
    given = [x for x in (file, env, credential) if x]
    if len(given) != 1:
        raise SecretError(f"{what}: give exactly one of *_file, *_env or *_credential")
    if file:
        return read_secret_file(file, what=what)
    if env:
        return read_secret_env(env, what=what)
    assert credential is not None
    return read_credential(credential, what=what)
