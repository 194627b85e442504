"""Two replicas told the same shard index: what they export makes the shard rules fire."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.e2e.harness import DaemonProcess, SimProcess
from watchd.kits.sharding import assignment

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = re.compile(r"^(watchd_identity_(?:owner|watched))\{([^}]*)\} ([0-9.]+)$", re.M)


def series(metrics: str, instance: str) -> list[dict[str, str]]:
    """The ownership samples of one /metrics page as promtool input series (30 minutes)."""
    return [
        {
            "series": f'{name}{{job="watchd", instance="{instance}", {labels}}}',
            "values": f"{float(value):g}x30",
        }
        for name, labels, value in SAMPLE.findall(metrics)
    ]


async def test_a_shared_shard_index_fires_overlap_and_gap(
    start_sim: Callable[..., SimProcess], tmp_path: Path
) -> None:
    """Replicas 'a' and 'b' both given index 0 of 2 export watchd_identity_watched; fed to
    the shipped rules, replica 0's identities are WatchdShardOverlap and replica 1's
    WatchdShardUnowned."""
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool missing: tests/setup/system-deps installs it (root and apt)")
    sim = start_sim(scenario="bulk_6")
    idents = [(i["username"], i["username"]) for i in sim.identities]
    table = assignment([n for n, _ in idents], replicas=2)
    assert {o for (o,) in table.values()} == {0, 1}
    daemons = []
    try:
        for name in ("a", "b"):
            home = tmp_path / name
            home.mkdir()
            d = DaemonProcess(
                home, sim, identities=idents, extra={"sharding": {"replicas": 2, "index": 0}}
            )
            daemons.append(d.start())
        inputs = []
        for name, d in zip(("a", "b"), daemons, strict=True):
            await d.wait_ready()
            _, metrics = await d.get("/metrics")
            for n, (owner,) in table.items():
                assert f'watchd_identity_watched{{identity="{n}"}} {float(owner == 0)}' in metrics
            inputs += series(metrics, f"{name}:9310")
    finally:
        for d in daemons:
            d.stop()
    annotations = {
        r["alert"]: r["annotations"]
        for g in yaml.safe_load((ROOT / "alerts" / "watchd.rules.yml").read_text())["groups"]
        for r in g["rules"]
        if "alert" in r  # the SLO group's recording rules have no annotations
    }
    expected = []
    for alert, owner, severity in (
        ("WatchdShardOverlap", 0, "warning"),
        ("WatchdShardUnowned", 1, "critical"),
    ):
        mine = sorted(n for n, (o,) in table.items() if o == owner)
        expected.append({"eval_time": "5m", "alertname": alert, "exp_alerts": []})
        expected.append(
            {
                "eval_time": "15m",
                "alertname": alert,
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": severity, "identity": n},
                        "exp_annotations": {
                            k: v.replace("{{ $labels.identity }}", n)
                            for k, v in annotations[alert].items()
                        },
                    }
                    for n in mine
                ],
            }
        )
    rules = tmp_path / "watchd.rules.yml"
    rules.write_text((ROOT / "alerts" / "watchd.rules.yml").read_text())
    case = tmp_path / "case.yml"
    case.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(rules)],
                "evaluation_interval": "1m",
                "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": expected}],
            }
        )
    )
    r = await asyncio.to_thread(
        subprocess.run,
        [promtool, "test", "rules", str(case)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
