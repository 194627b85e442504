"""What every part of watchd's configuration is built from.

The strict base model (unknown keys are errors, values frozen), durations
(``90s``, ``15m``, ``1h30m``) with stated floors, http(s) URLs without
credentials, alert matchers checked at load, :class:`SecretRef` (the one shape
of a ``*_file`` / ``*_env`` / ``*_credential`` reference), and
:class:`ConfigError`, whose lines each name the path of one problem.

Reads nothing: files and secrets are read by ``loading`` and ``secrets``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
)

from watchd.kits.matchers import MatcherError, parse_matcher

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class ConfigError(Exception):
    """Invalid configuration: ``problems`` has one line per problem, each naming its path."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def parse_duration(value: Any) -> float:
    """``90s``, ``15m``, ``2h``, ``1h30m``, ``500ms`` (or a bare number of seconds)."""
    if isinstance(value, bool):
        raise ValueError("a duration like 90s, 15m or 2h is required")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("durations cannot be negative")
        return float(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError("a duration like 90s, 15m or 2h is required")
    text = value.strip()
    pos = 0
    total = 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"{value!r} is not a duration (use e.g. 90s, 15m, 2h, 1h30m)")
    return total


# A duration as the file may write it, for the JSON Schema (config/watchd.schema.json):
# parse_duration's own grammar, or a number of seconds.
DurationInput = (
    Annotated[str, StringConstraints(pattern=rf"^\s*(?:{_DURATION.pattern})+\s*$")]
    | Annotated[float, Field(ge=0)]
)
# Every duration field's validator: parse the text, and say what it takes in the schema.
AS_DURATION = BeforeValidator(parse_duration, json_schema_input_type=DurationInput)
Duration = Annotated[float, AS_DURATION]


def floor(seconds: float, why: str) -> AfterValidator:
    """A duration's lower bound, stated (with the reason) in the error."""

    def check(value: float | None) -> float | None:
        if value is not None and value < seconds:
            raise ValueError(
                f"{format_duration(value, exact=True)} is below the minimum of "
                f"{format_duration(seconds, exact=True)} ({why})"
            )
        return value

    return AfterValidator(check)


# Floors: each stops a setting from turning into a busy loop or a hair trigger.
TICK = "anything shorter is a busy loop"
Budget = Annotated[float, AS_DURATION, floor(1.0, "a budget is time in status")]
Timeout = Annotated[float, AS_DURATION, floor(0.1, "no request completes that fast")]


def format_duration(seconds: float, *, exact: bool = False) -> str:
    if exact and seconds < 60 and seconds != round(seconds):
        return f"{seconds * 1000:.0f}ms" if seconds < 1 else f"{seconds:g}s"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            n, seconds = divmod(seconds, size)
            parts.append(f"{n}{unit}")
    return "".join(parts[:2])


def duration_text(seconds: float) -> str:
    """:func:`format_duration` of the whole second (all it depends on), remembered: a
    burst of ten thousand alerts says the same few durations."""
    whole = round(seconds)
    text = _DURATIONS.get(whole)
    if text is None:
        if len(_DURATIONS) >= 4096:
            _DURATIONS.clear()
        text = _DURATIONS[whole] = format_duration(whole)
    return text


_DURATIONS: dict[int, str] = {}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True, slots=True)
class SecretRef:
    """Where a secret is: a file, an environment variable, or a systemd credential.

    The YAML keeps the three flat keys (``{stem}_file``, ``{stem}_env``,
    ``{stem}_credential``); this is their one shape once read, so that checking and
    resolving a reference is written once, not once per secret.
    """

    stem: str
    file: str | None = None
    env: str | None = None
    credential: str | None = None

    @classmethod
    def of(cls, model: BaseModel, stem: str) -> SecretRef:
        return cls(
            stem=stem,
            file=getattr(model, f"{stem}_file"),
            env=getattr(model, f"{stem}_env"),
            credential=getattr(model, f"{stem}_credential"),
        )

    @property
    def given(self) -> int:
        """How many of the three keys are set (1 is the only valid count, 0 = absent)."""
        return sum(1 for v in (self.file, self.env, self.credential) if v)

    @property
    def keys(self) -> list[str]:
        return [f"{self.stem}_{kind}" for kind in ("file", "env", "credential")]


def exactly_one_ref(model: BaseModel, stem: str) -> None:
    """A secret is given by exactly one of ``{stem}_file``, ``_env``, ``_credential``."""
    ref = SecretRef.of(model, stem)
    if ref.given != 1:
        raise ValueError(f"give exactly one of {', '.join(ref.keys)}")


def http_url(value: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL")
    if parts.username or parts.password:
        raise ValueError("credentials in URLs are not allowed; use a *_file reference")
    return value.rstrip("/")


HttpUrl = Annotated[str, BeforeValidator(lambda v: http_url(v) if isinstance(v, str) else v)]


def check_matchers(values: list[str]) -> list[str]:
    for v in values:
        try:
            parse_matcher(v)
        except MatcherError as exc:
            raise ValueError(str(exc)) from None
    return values


Matchers = Annotated[list[str], BeforeValidator(lambda v: v), Field(default_factory=list)]
