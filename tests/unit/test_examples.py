"""The shipped example configurations stay valid, against the models and against the JSON
Schema generated from them (config/watchd.schema.json), which must not drift from them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from watchd.config import schema
from watchd.config.fields import ConfigError
from watchd.config.loading import parse_config

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "config" / "watchd.schema.json"


def examples() -> dict[str, Any]:
    """Every example config: config/*.yaml and the ``watchd.yaml`` key of each ConfigMap in
    the Kubernetes manifests (templates that are not YAML yet, a chart's, are not read)."""
    found = {
        str(p.relative_to(ROOT)): yaml.safe_load(p.read_text())
        for p in (ROOT / "config").glob("*.yaml")
    }
    for manifest in sorted((ROOT / "deploy" / "kubernetes").rglob("*.yaml")):
        try:
            docs = list(yaml.safe_load_all(manifest.read_text()))
        except yaml.YAMLError:
            continue
        for doc in docs:
            if not isinstance(doc, dict) or doc.get("kind") != "ConfigMap":
                continue
            if "watchd.yaml" in (doc.get("data") or {}):
                name = f"{manifest.relative_to(ROOT)}:{doc['metadata']['name']}"
                found[name] = yaml.safe_load(doc["data"]["watchd.yaml"])
    return found


def validator() -> jsonschema.Draft202012Validator:
    shipped = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(shipped)
    return jsonschema.Draft202012Validator(shipped)


def test_example_config_parses() -> None:
    """config/watchd.example.yaml validates against the models."""
    for path in (ROOT / "config").glob("*.yaml"):
        config = parse_config(yaml.safe_load(path.read_text()), source=str(path))
        assert config.identities


def test_the_shipped_schema_is_the_models_schema() -> None:
    """config/watchd.schema.json is exactly what the models generate: change a model and
    this fails until `make schema` is run."""
    assert SCHEMA.read_text() == schema.render(), "run `make schema`"


def test_every_example_config_validates_against_the_schema() -> None:
    """Each example (config/ and the manifests' ConfigMaps) passes the shipped schema and
    the models alike, and the example's modeline points editors at that schema."""
    check = validator()
    found = examples()
    assert len(found) >= 2, sorted(found)  # the example and at least one manifest
    for name, data in found.items():
        problems = [f"{e.json_path}: {e.message}" for e in check.iter_errors(data)]
        assert problems == [], name
        parse_config(data, source=name)
    example = ROOT / "config" / "watchd.example.yaml"
    modeline = re.match(r"# yaml-language-server: \$schema=(\S+)\n", example.read_text())
    assert modeline and (example.parent / modeline.group(1)).resolve() == SCHEMA


IDENT = {"name": "a", "url": "https://coder.example.com", "token_env": "T"}


@pytest.mark.parametrize(
    "extra",
    [
        {"reconcile_interval": "1h30m"},
        {"reconcile_interval": 90},
        {"reconcile_interval": " 500ms10s "},
        {"budgets": {"running": "2h", "other": {"thinking": "15m"}}},
        {"cost": {"threshold_usd": "$2.50"}},
        {"cost": {"threshold_usd": 25}},
        {"route": {"receiver": "console", "group_wait": "0s"}},
    ],
)
def test_what_the_models_take_the_schema_takes(extra: dict[str, Any]) -> None:
    """Durations in every written form, dollar amounts as text or numbers: both accept."""
    data = {"identities": [IDENT], **extra}
    parse_config(data)
    assert list(validator().iter_errors(data)) == []


@pytest.mark.parametrize(
    "extra",
    [
        {"bogus": 1},
        {"reconcile_interval": "5 minutes"},
        {"reconcile_interval": "90"},
        {"reconcile_interval": -5},
        {"reconcile_interval": True},
        {"server": {"listen": "127.0.0.1:1", "max_body_bytes": 10}},
        {"identities": [{**IDENT, "token": "inline"}]},
        {"budgets": {"running": "soon"}},
        {"cost": {"threshold_usd": "twenty"}},
        {"cost": {"threshold_usd": 0}},
        {"sharding": {"index_from": "ordinal"}},
    ],
)
def test_what_the_schema_refuses_the_models_refuse(extra: dict[str, Any]) -> None:
    """Unknown keys, durations and amounts that do not parse, inline secrets, values out of
    range or outside an enumeration: refused by the schema and by the models alike."""
    data = {"identities": [IDENT], **extra}
    assert list(validator().iter_errors(data)) != []
    with pytest.raises(ConfigError):
        parse_config(data)
