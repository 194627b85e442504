"""Reading secrets given by reference: a file, an environment variable, or a
systemd credential name resolved under ``$CREDENTIALS_DIRECTORY``; and
:func:`resolve_secrets`, which reads every reference a configuration makes (and
checks each identity's ``ca_file``, the one other file it names: not a secret, but read
when the tokens are, with its problems listed beside theirs).

Errors name the reference (path, variable, credential), never the content.
Every secret read is registered with :data:`watchd.kits.redaction.REGISTRY`
so the log pipeline can scrub it from any line as a last line of defence.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Collection
from pathlib import Path

from pydantic import BaseModel, ConfigDict, SecretStr

from watchd.config.fields import ConfigError, SecretRef, http_url
from watchd.config.model import Config
from watchd.kits import tls
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


# The shipped unit loads a whole directory (``LoadCredential=watchd:/etc/watchd/credentials``),
# which systemd names ``watchd_<file>``: a credential is looked for under its own name,
# then under that one, so ``token_credential: team-a`` works with either unit.
DIRECTORY_PREFIX = "watchd_"


def read_credential(name: str, *, what: str) -> str:
    """A systemd credential (``LoadCredential=``) by name: ``NAME``, else
    ``watchd_NAME`` (a file of the directory the shipped unit loads)."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        raise SecretError(
            f"{what}: credential {name!r} requested but $CREDENTIALS_DIRECTORY is not set "
            "(not running under systemd with LoadCredential=?)"
        )
    if "/" in name or name in {".", ".."}:
        raise SecretError(f"{what}: credential name {name!r} is not a plain name")
    own, loaded = Path(directory) / name, Path(directory) / (DIRECTORY_PREFIX + name)
    if not own.exists() and loaded.exists():
        return read_secret_file(loaded, what=what)
    if not own.exists():
        raise SecretError(
            f"{what}: credential {name!r} is not loaded (neither {name} nor "
            f"{DIRECTORY_PREFIX}{name} in $CREDENTIALS_DIRECTORY): put the file in "
            "/etc/watchd/credentials (docs/systemd.md)"
        )
    return read_secret_file(own, what=what)


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


class ResolvedSecrets(BaseModel):
    """Secret values, held as SecretStr so that repr/str/logging never show them.

    ``problems`` lists the references that could not be read when resolved with
    ``strict=False`` (each naming its path, never a value); their secrets are absent.
    """

    model_config = ConfigDict(frozen=True)
    tokens: dict[str, SecretStr]
    receivers: dict[str, SecretStr]
    receiver_hmac: dict[str, SecretStr]
    ingest_token: SecretStr | None
    admin_token: SecretStr | None = None
    heartbeat_url: SecretStr | None = None
    problems: tuple[str, ...] = ()


def _read(ref: SecretRef, path: str, problems: list[str]) -> str | None:
    """The referenced value, or None with the problem (naming ``path``) appended."""
    try:
        return resolve(file=ref.file, env=ref.env, credential=ref.credential, what=path)
    except SecretError as exc:
        problems.append(str(exc))
        return None


def _read_url(ref: SecretRef, path: str, problems: list[str]) -> SecretStr | None:
    """A secret that must be an http(s) URL (Slack's webhook, a heartbeat ping URL)."""
    v = _read(ref, path, problems)
    if v is None:
        return None
    try:
        http_url(v)
    except ValueError:
        problems.append(f"{path}: the referenced value is not an http(s) URL")
        return None
    return SecretStr(v)


def resolve_secrets(
    config: Config,
    *,
    identities: bool = True,
    receivers: Collection[str] | None = None,
    server: bool = True,
    strict: bool = True,
) -> ResolvedSecrets:
    """Read the referenced secrets; all problems are collected, each naming its path.

    A command reads only what it uses: ``identities`` (tokens), ``receivers`` (these
    receivers' secrets; None means all), ``server`` (ingest and admin tokens). With
    ``strict`` a problem raises ConfigError; without, it is listed in ``problems``.
    """
    problems: list[str] = []
    tokens: dict[str, SecretStr] = {}
    recv: dict[str, SecretStr] = {}
    hmac: dict[str, SecretStr] = {}

    for i, ident in enumerate(config.identities if identities else []):
        path = f"identities.{i}.token ({ident.name})"
        v = _read(SecretRef.of(ident, "token"), path, problems)
        if v is not None:
            tokens[ident.name] = SecretStr(v)
        if ident.ca_file is not None:
            try:
                tls.trust(ident.ca_file)
            except ValueError as exc:
                problems.append(f"identities.{i}.ca_file ({ident.name}): {exc}")
    for i, r in enumerate(config.receivers):
        if receivers is not None and r.name not in receivers:
            continue
        path = f"receivers.{i}.{r.kind} ({r.name})"
        if r.pagerduty:
            v = _read(SecretRef.of(r.pagerduty, "routing_key"), path + ".routing_key", problems)
            if v is not None:
                if not re.fullmatch(r"[A-Za-z0-9]{32}", v):
                    problems.append(f"{path}.routing_key: must be 32 alphanumeric characters")
                else:
                    recv[r.name] = SecretStr(v)
        elif r.slack:
            url = _read_url(SecretRef.of(r.slack, "webhook_url"), path + ".webhook_url", problems)
            if url is not None:
                recv[r.name] = url
        elif r.webhook and SecretRef.of(r.webhook, "hmac_secret").given:
            v = _read(SecretRef.of(r.webhook, "hmac_secret"), path + ".hmac_secret", problems)
            if v is not None:
                hmac[r.name] = SecretStr(v)
    ingest = None
    admin = None
    beat = None
    if server:
        ref = SecretRef.of(config.server, "ingest_token")
        if ref.given:
            v = _read(ref, "server.ingest_token", problems)
            if v is not None:
                ingest = SecretStr(v)
        admin = resolve_admin_token(config, problems)
        ref = SecretRef.of(config.heartbeat, "ping_url")
        if ref.given:
            beat = _read_url(ref, "heartbeat.ping_url", problems)
    if problems and strict:
        raise ConfigError(problems)
    return ResolvedSecrets(
        tokens=tokens,
        receivers=recv,
        receiver_hmac=hmac,
        ingest_token=ingest,
        admin_token=admin,
        heartbeat_url=beat,
        problems=tuple(problems),
    )


def resolve_admin_token(config: Config, problems: list[str]) -> SecretStr | None:
    """The admin token alone (what ``watchd silence`` needs), or None if not configured."""
    ref = SecretRef.of(config.server, "admin_token")
    if not ref.given:
        return None
    v = _read(ref, "server.admin_token", problems)
    return None if v is None else SecretStr(v)
