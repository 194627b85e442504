"""YAML → :class:`~watchd.config.model.Config`, with every problem named by its path.

Keys given twice are refused (PyYAML would silently keep the last); pydantic's
errors become one :class:`~watchd.config.fields.ConfigError` line each. Reads the
file and nothing else: secrets are resolved separately (``secrets``).
"""

from __future__ import annotations

import functools
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from watchd.config.fields import ConfigError
from watchd.config.model import Config

DEFAULT_CONFIG_PATH = "/etc/watchd/watchd.yaml"


@functools.cache
def _secret_fields(model: type[BaseModel] = Config) -> frozenset[str]:
    """Every name ``x`` some model takes as a reference (``x_file`` beside ``x_env``)."""
    found: set[str] = set()
    seen: set[type[BaseModel]] = set()
    stack = [model]
    while stack:
        m = stack.pop()
        if m in seen:
            continue
        seen.add(m)
        names = set(m.model_fields)
        found.update(n[: -len("_file")] for n in names if n.endswith("_file"))
        for f in m.model_fields.values():
            for t in _models_in(f.annotation):
                stack.append(t)
    return frozenset(n for n in found if n)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models_in(a)]


# Alertmanager's old route keys, which watchd (like Alertmanager since 0.22) spells
# as ``matchers``.
_OLD_MATCHERS = {
    "match": "matchers: ['name=\"value\"']",
    "match_re": "matchers: ['name=~\"regex\"']",
}


def _unknown_key(key: str) -> str:
    """What to say about a key the model does not take."""
    if key in _secret_fields():
        return (
            f"unknown key: secrets are references, never inline values: use {key}_file, "
            f"{key}_env or {key}_credential"
        )
    if key in _OLD_MATCHERS:
        return f"unknown key: Alertmanager's old form; write {_OLD_MATCHERS[key]}"
    return "unknown key"


def _format_errors(exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors(include_url=False, include_input=False):
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        last = str(err["loc"][-1]) if err["loc"] else ""
        if err["type"] == "extra_forbidden":
            msg = _unknown_key(last)
        elif err["type"] == "list_type" and last.endswith("matchers"):
            msg = "expected a list of matchers, e.g. ['alertname=\"ChatStuck\"']"
        msg = msg.removeprefix("Value error, ")
        if not err["loc"] and re.match(r"^[a-z_][a-z0-9_.]*: ", msg):
            out.append(msg)  # a cross-field check that names its own path
            continue
        out.append(f"{path}: {msg}")
    return out


def parse_config(data: Any, *, source: str = "config") -> Config:
    if data is None:
        raise ConfigError([f"{source}: empty configuration"])
    if not isinstance(data, dict):
        raise ConfigError([f"{source}: top level must be a mapping"])
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc)) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML says keys are
    unique; PyYAML silently keeps the last, hiding a typo)."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                line = key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise _DuplicateKey(key, line, seen[key])
                    seen[key] = line
                except TypeError:  # an unhashable key: the normal path reports it
                    continue
        return super().construct_mapping(node, deep=deep)  # type: ignore[arg-type]


class _DuplicateKey(Exception):
    def __init__(self, key: object, line: int, first: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


def load_yaml(text: str, *, source: str) -> Any:
    """YAML with unique keys; errors are ConfigError lines naming the place."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except _DuplicateKey as dup:
        raise ConfigError(
            [
                f"{source}: line {dup.line}: duplicate key {dup.key!r} "
                f"(first given at line {dup.first})"
            ]
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError([f"{source}: not valid YAML{where}"]) from None


def load_config(path: str | Path) -> Config:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{p}: cannot read ({exc.strerror or type(exc).__name__})"]) from None
    return parse_config(load_yaml(text, source=str(p)), source=str(p))
