"""The meta-monitoring rules in alerts/ only use metrics watchd exports."""

from __future__ import annotations

import re
import shutil
import subprocess
import typing
from pathlib import Path

import pytest
import yaml

from watchd.daemon import collector, families, metrics

ROOT = Path(__file__).resolve().parents[2]


def exported_families() -> set[str]:
    source = "".join(Path(m.__file__).read_text() for m in (metrics, collector, families))
    return set(re.findall(r'"(watchd_[a-z_]+)"', source))


def test_rules_reference_only_exported_metrics() -> None:
    """Every watchd_* metric in alerts/watchd.rules.yml is one /metrics exposes."""
    rules = yaml.safe_load((ROOT / "alerts" / "watchd.rules.yml").read_text())
    exported = exported_families()
    used = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "record" in rule:  # a recording rule: its expression is checked all the same
                assert rule["record"].startswith("watchd:") and rule["expr"]
            else:
                assert rule["alert"] and rule["expr"] and rule["annotations"]["summary"]
            found = re.findall(r"\b(watchd_[a-z_]+)", str(rule["expr"]))
            used |= {re.sub(r"_(bucket|count|sum|info)$", "", m) for m in found}
    assert used and used <= exported, sorted(used - exported)


def promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        pytest.skip("promtool missing: tests/setup/system-deps installs it (root and apt)")
    return found


def test_promtool_rule_unit_tests_pass() -> None:
    """`promtool test rules` passes every case in alerts/watchd.rules.test.yml."""
    r = subprocess.run(
        [promtool(), "test", "rules", str(ROOT / "alerts" / "watchd.rules.test.yml")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_rule_has_a_firing_and_a_quiet_case() -> None:
    """Each rule is tested both where it must fire and where it must stay silent."""
    rules = yaml.safe_load((ROOT / "alerts" / "watchd.rules.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((ROOT / "alerts" / "watchd.rules.test.yml").read_text())["tests"]
    fires: set[str] = set()
    quiet: set[str] = set()
    for t in tests:
        for case in t["alert_rule_test"]:
            if case["exp_alerts"]:
                fires.add(case["alertname"])
                # Input series that the expected alerts leave out must not alert.
                if len(t["input_series"]) > len(case["exp_alerts"]):
                    quiet.add(case["alertname"])
            else:
                quiet.add(case["alertname"])
    assert fires == names and quiet == names


def test_notifications_failing_needed_ignoring_outcome(tmp_path: Path) -> None:
    """With a plain `and` (as shipped in 0.1) the failing-receiver case gets no alert."""
    rules = (ROOT / "alerts" / "watchd.rules.yml").read_text()
    assert "and ignoring(outcome) increase" in rules
    (tmp_path / "watchd.rules.yml").write_text(rules.replace("and ignoring(outcome)", "and"))
    (tmp_path / "t.yml").write_text((ROOT / "alerts" / "watchd.rules.test.yml").read_text())
    r = subprocess.run(
        [promtool(), "test", "rules", str(tmp_path / "t.yml")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert r.returncode == 1
    out = r.stdout + r.stderr
    assert "WatchdNotificationsFailing" in out and "got:[]" in out.replace(" ", "")


def test_every_rule_and_every_alert_watchd_sends_has_a_runbook() -> None:
    """Each rule carries a description and a runbook_url that points at a section of
    docs/runbooks.md, and every alert watchd itself sends has a section there too."""
    import re

    from watchd.detection.budgets import ChatVerdict

    text = (ROOT / "docs" / "runbooks.md").read_text()
    anchors = {h.strip().lower() for h in re.findall(r"^#+ (\S+)$", text, re.M)}
    rules = yaml.safe_load((ROOT / "alerts" / "watchd.rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                continue
            ann = rule["annotations"]
            assert ann.get("description"), rule["alert"]
            url = ann["runbook_url"]
            assert url == f"docs/runbooks.md#{rule['alert'].lower()}", url
            assert rule["alert"].lower() in anchors, rule["alert"]
    sent = set(typing.get_args(ChatVerdict)) | {
        "ChatSwept", "IdentityUnhealthy", "IdentityDegraded", "QuotaLow",
        "QuotaExhaustionForecast", "StateNotPersisted", "StateReset", "Watchdog",
    }  # fmt: skip
    assert {n.lower() for n in sent} <= anchors, sorted(n for n in sent if n.lower() not in anchors)
