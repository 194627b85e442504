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
    """amtool check-config accepts an alertmanager.yml with both shipped rule files
    merged in (watchd's defaults, and the rules' own)."""
    meta = RULES.parent / "watchd-rules-inhibit.yml"
    doc = {
        "route": {"receiver": "null"},
        "receivers": [{"name": "null"}],
        "inhibit_rules": [
            *yaml.safe_load(RULES.read_text())["inhibit_rules"],
            *yaml.safe_load(meta.read_text())["inhibit_rules"],
        ],
    }
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(doc))
    r = subprocess.run(
        ["amtool", "check-config", str(path)], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "6 inhibit rules" in r.stdout


META = RULES.parent / "watchd-rules-inhibit.yml"


def test_a_revoked_token_pages_once_through_the_shipped_meta_inhibit_rules() -> None:
    """With deploy/alertmanager/watchd-rules-inhibit.yml, the three alerts one revoked token
    raises (watchd's IdentityUnhealthy, the rules' WatchdIdentityNotReady and
    WatchdListingStale) leave one unmuted, by Alertmanager's inhibition semantics; and
    WatchdDown holds back every other Watchd* rule of its instance, but not itself."""
    from watchd.alerting.model import Alert
    from watchd.alerting.silencing import Inhibitor

    rules = [
        InhibitRule.model_validate(r) for r in yaml.safe_load(META.read_text())["inhibit_rules"]
    ]
    inhibitor = Inhibitor(rules)

    def alert(name: str, **labels: str) -> Alert:
        return Alert(name + str(sorted(labels.items())), {"alertname": name, **labels}, {}, 0.0)

    fault = [
        alert("IdentityUnhealthy", identity="team-a", deployment="https://c"),
        alert("WatchdIdentityNotReady", identity="team-a", instance="w:9310", job="watchd"),
        alert("WatchdListingStale", identity="team-a", instance="w:9310", job="watchd"),
    ]
    muted = inhibitor.index()
    for a in fault:
        muted.add(a)
    assert [a.name for a in fault if not muted(a)] == ["IdentityUnhealthy"]
    down = [
        alert("WatchdDown", instance="w:9310", job="watchd"),
        alert("WatchdNotificationsFailing", instance="w:9310", receiver="pager"),
        alert("WatchdNotificationsFailing", instance="other:9310", receiver="pager"),
    ]
    muted = inhibitor.index()
    for a in down:
        muted.add(a)
    assert [a.labels.get("instance") for a in down if not muted(a)] == ["w:9310", "other:9310"]


def test_the_meta_inhibit_rules_name_only_alerts_that_exist() -> None:
    """Every alert name the shipped meta rules match is a rule in alerts/ or an alert
    watchd sends."""
    import re

    names = set(
        re.findall(r"alert: (\w+)", (RULES.parents[2] / "alerts" / "watchd.rules.yml").read_text())
    )
    names |= {"IdentityUnhealthy"}
    text = META.read_text()
    used = set(re.findall(r'alertname=~?"([\w|.+]+)"', text))
    for pattern in used:
        for name in pattern.split("|"):
            if name.endswith(".+"):
                assert any(n.startswith(name[:-2]) for n in names), name
            else:
                assert name in names, name
