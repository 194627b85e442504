"""The configuration's JSON Schema, generated from the models (never written by hand).

``python -m watchd.config.schema`` prints it; ``make schema`` writes it to
``config/watchd.schema.json``, which editors read through the example's
``# yaml-language-server: $schema=...`` modeline, and a test fails when the models and
the shipped file drift. Each field's description is the comment block above it in its
model (where the code says why a default is what it is), so the schema says what the
models say. The models stay the rule: cross-field checks (exactly one of ``*_file``,
``*_env``, ``*_credential``; receiver names the route uses) are ``check-config``'s.

Reads nothing but the models' source; writes only where ``-o`` says.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from watchd.config.model import Config

DRAFT = "https://json-schema.org/draft/2020-12/schema"
# A field at class level (four spaces in), its name first: ``    name: type = default``.
_FIELD = re.compile(r"    (\w+)\s*:")
# The three keys of a secret reference (config.fields.SecretRef), and what each names.
_KINDS = {
    "file": "the path of a file holding it (not world-readable)",
    "env": "the name of an environment variable holding it",
    "credential": "the name of a systemd credential ($CREDENTIALS_DIRECTORY/NAME)",
}
_REF = re.compile(r"(?P<stem>\w+)_(?P<kind>file|env|credential)")


def schema() -> dict[str, Any]:
    """Config's schema (validation mode: what a file may say), with descriptions."""
    doc = Config.model_json_schema(mode="validation")
    for model in _models(Config):
        target = doc if model is Config else doc["$defs"][model.__name__]
        described = _comments(model)
        props = target.get("properties", {})
        for name, prop in props.items():
            # pydantic's title is the field name capitalised: noise in an editor's hover.
            prop.pop("title", None)
            ref = _REF.fullmatch(name)
            if ref and all(f"{ref['stem']}_{kind}" in props for kind in _KINDS):
                stem = ref["stem"]
                said = described.get(f"{stem}_file", "")
                prop["description"] = (
                    f"{said} A secret is a reference, never a value: give one of "
                    f"{stem}_file, {stem}_env, {stem}_credential. This one is "
                    f"{_KINDS[ref['kind']]}."
                ).strip()
            elif name in described:
                prop.setdefault("description", described[name])
    return {
        "$schema": DRAFT,
        "title": "watchd configuration",
        "description": "watchd's YAML configuration (docs/configuration.md). Generated from "
        "the models by `python -m watchd.config.schema`; `watchd check-config` is the rule.",
        **{k: v for k, v in doc.items() if k != "title"},
    }


def render() -> str:
    """The schema as the shipped file holds it."""
    return json.dumps(schema(), indent=2, ensure_ascii=False) + "\n"


def _models(root: type[BaseModel]) -> list[type[BaseModel]]:
    """Every model reachable from ``root``'s fields, ``root`` first."""
    found: list[type[BaseModel]] = []
    stack = [root]
    while stack:
        model = stack.pop()
        if model in found:
            continue
        found.append(model)
        for field in model.model_fields.values():
            stack.extend(_in(field.annotation))
    return found


def _in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _in(a)]


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """Field name → the comment block right above it in the class body, joined."""
    lines, _ = inspect.getsourcelines(model)
    out: dict[str, str] = {}
    block: list[str] = []
    for line in lines[1:]:
        text = line.strip()
        if text.startswith("#"):
            block.append(text.lstrip("#").strip())
            continue
        field = _FIELD.match(line)
        if field and block and field.group(1) in model.model_fields:
            out[field.group(1)] = " ".join(block)
        block = []
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m watchd.config.schema",
        description="Print watchd's configuration JSON Schema, generated from the models.",
    )
    parser.add_argument("-o", "--output", help="write it to this file instead of stdout")
    args = parser.parse_args(argv)
    text = render()
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        Path(args.output).write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"{args.output}: cannot write ({exc.strerror})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
