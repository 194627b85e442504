"""The shipped example configuration stays valid."""

from __future__ import annotations

from pathlib import Path

import yaml

from watchd.config.loading import parse_config

ROOT = Path(__file__).resolve().parents[2]


def test_example_config_parses() -> None:
    """config/watchd.example.yaml validates against the schema."""
    for path in (ROOT / "config").glob("*.yaml"):
        config = parse_config(yaml.safe_load(path.read_text()), source=str(path))
        assert config.identities
