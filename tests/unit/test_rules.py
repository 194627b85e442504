"""The meta-monitoring rules in alerts/ only use metrics watchd exports."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from watchd.daemon import status

ROOT = Path(__file__).resolve().parents[2]


def exported_families() -> set[str]:
    source = Path(status.__file__).read_text()
    return set(re.findall(r'"(watchd_[a-z_]+)"', source))


def test_rules_reference_only_exported_metrics() -> None:
    """Every watchd_* metric in alerts/watchd.rules.yml is one /metrics exposes."""
    rules = yaml.safe_load((ROOT / "alerts" / "watchd.rules.yml").read_text())
    exported = exported_families()
    used = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["alert"] and rule["expr"] and rule["annotations"]["summary"]
            used |= set(re.findall(r"\b(watchd_[a-z_]+)", str(rule["expr"])))
    assert used and used <= exported, sorted(used - exported)
