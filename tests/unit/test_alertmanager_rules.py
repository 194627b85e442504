"""The inhibit rules shipped for users' own Alertmanagers are watchd's defaults, and valid."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from watchd.config.alerting import InhibitRule, default_inhibit

RULES = Path(__file__).parents[2] / "deploy" / "alertmanager" / "watchd-inhibit-rules.yml"


def test_the_shipped_inhibit_rules_are_watchds_defaults() -> None:
    """deploy/alertmanager/watchd-inhibit-rules.yml says what watchd's defaults do,
    FleetIncident → its members by (deployment, cause) among them."""
    shipped = [
        InhibitRule.model_validate(r) for r in yaml.safe_load(RULES.read_text())["inhibit_rules"]
    ]
    assert shipped == default_inhibit()
    assert any(r.equal == ["deployment", "cause"] for r in shipped)


@pytest.mark.skipif(
    shutil.which("amtool") is None, reason="amtool (prometheus-alertmanager) missing"
)
def test_alertmanager_accepts_the_shipped_inhibit_rules(tmp_path: Path) -> None:
    """amtool check-config accepts an alertmanager.yml with the shipped rules merged in."""
    doc = {
        "route": {"receiver": "null"},
        "receivers": [{"name": "null"}],
        **yaml.safe_load(RULES.read_text()),
    }
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(doc))
    r = subprocess.run(
        ["amtool", "check-config", str(path)], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 inhibit rules" in r.stdout
