"""The Grafana dashboard in deploy/grafana/: importable JSON whose every query parses
(promtool) and names only series watchd exports or its shipped rules record."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from tests.unit.test_rules import ROOT, exported_families, promtool

DASHBOARD = ROOT / "deploy" / "grafana" / "watchd.json"


def queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def test_the_dashboard_is_importable_json_with_unique_panels() -> None:
    """A uid, a title, a Prometheus datasource variable, unique panel ids, each panel
    with a query and a place on the grid."""
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 30
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "job", "identity"} <= names
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and len(ids) >= 8
    for p in dash["panels"]:
        assert p["targets"] and {"x", "y", "w", "h"} <= p["gridPos"].keys(), p["title"]


def test_every_query_names_only_exported_or_recorded_series() -> None:
    """Each watchd_* series is one /metrics exposes (histogram and info suffixes aside),
    each watchd:* one alerts/watchd.rules.yml records; the issue's topics all appear."""
    rules = yaml.safe_load((ROOT / "alerts" / "watchd.rules.yml").read_text())
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    exported = exported_families()
    used, rec = set(), set()
    for q in queries():
        used |= {
            re.sub(r"_(bucket|count|sum|info)$", "", m)
            for m in re.findall(r"\b(watchd_[a-z_]+)", q)
        }
        rec |= set(re.findall(r"\b(watchd:[a-z_:0-9]+)", q))
    assert used <= exported, sorted(used - exported)
    assert rec <= recorded, sorted(rec - recorded)
    for topic in (
        "watchd_chats",
        "watchd_chat_oldest_status_age_seconds",
        "watchd_chat_status_duration_seconds",
        "watchd_fleet_incidents",
        "watchd_agent_segments_total",
        "watchd_agent_redials_total",
        "watchd_identity_ready",
    ):
        assert topic in used, topic


def test_every_query_parses_with_promtool(tmp_path: Path) -> None:
    """Each query, its Grafana variables filled in, is valid PromQL by promtool's parser
    (as a recording rule's expression)."""
    filled = [
        q.replace("$__rate_interval", "5m").replace("$job", ".*").replace("$identity", ".*")
        for q in queries()
    ]
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:q{i}", "expr": q} for i, q in enumerate(filled)],
            }
        ]
    }
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    r = subprocess.run(
        [promtool(), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
