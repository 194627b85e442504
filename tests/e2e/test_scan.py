"""`watchd scan`: one pass, what would alert, and its exit codes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.e2e.harness import DaemonProcess, SimProcess

StartSim = Callable[..., SimProcess]


async def scan(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "watchd", "scan", "-c", str(config), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_scan_exit_codes_json_and_sweep_preview(tmp_path: Path, start_sim: StartSim) -> None:
    """0 when nothing is stuck, 1 with the stuck chats (hint, lower-bound clock, sweep plan)
    when some are, 2 when an identity cannot be listed."""
    sim = start_sim()
    d = DaemonProcess(
        tmp_path,
        sim,
        identities=[("team-a", "alice")],
        extra={
            "budgets": {"running": "5m"},
            "sweep": {
                "enabled": True,
                "policies": [
                    {
                        "name": "wedged",
                        "status": ["running"],
                        "older_than": "10m",
                        "action": "interrupt_then_archive",
                    }
                ],
            },
        },
    )
    await sim.add_chat("alice", status="running", age=60, title="fresh enough")
    ok = await scan(d.config_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    stuck = await sim.add_chat("alice", status="running", age=900, title="wedged turn")
    await sim.add_chat("alice", status="requires_action", age=9000, title="paused")
    out = await scan(d.config_path, "--json")
    assert out.returncode == 1, out.stderr
    (result,) = json.loads(out.stdout)["results"]
    running = [s for s in result["stuck"] if s["status"] == "running"]
    assert [s["chat_id"] for s in running] == [stuck]
    assert running[0]["clock"] == "lower_bound" and running[0]["time_in_status_seconds"] >= 900
    assert "hint" in running[0]
    assert [w["chat_id"] for w in result["sweep"]] == [stuck]
    text = await scan(d.config_path)
    assert "sweep would interrupt_then_archive" in text.stdout and "wedged turn" in text.stdout
    assert (await sim.admin("GET", "/state"))["mutations"] == [], "scan must not act"
    cfg = yaml.safe_load(d.config_path.read_text())
    await sim.admin("POST", "/users/alice/revoke")
    d.config_path.write_text(yaml.safe_dump(cfg))
    bad = await scan(d.config_path)
    assert bad.returncode == 2 and "COULD NOT SCAN" in bad.stdout
    assert sim.token("alice") not in bad.stdout + bad.stderr


async def test_scan_shows_quota_and_says_it_cannot_fit_a_trend(
    tmp_path: Path, start_sim: StartSim
) -> None:
    """scan prints each quota (text, --json) and says one pass cannot fit a trend."""
    sim = start_sim()
    await sim.admin("POST", "/users/alice/quota", {"budget": 100, "consumed": 40})
    await sim.admin("POST", "/users/bob/quota", {"budget": -1, "consumed": 7})
    d = DaemonProcess(tmp_path, sim, identities=[("team-a", "alice"), ("team-b", "bob")])
    text = await scan(d.config_path)
    assert text.returncode == 0, text.stdout + text.stderr
    assert "quota: 40 of 100 credits used, 60 left; one pass cannot fit a trend" in text.stdout
    assert "quota: no budget (-1), 7 credits used" in text.stdout
    out = await scan(d.config_path, "--json")
    results = {r["identity"]: r for r in json.loads(out.stdout)["results"]}
    q = results["team-a"]["quota"]
    assert (q["headroom"], q["rate_per_hour"], q["forecast"]) == (60, None, None)
    assert "cannot fit a trend" in q["note"]
    assert results["team-b"]["quota"]["state"] == "unlimited"


async def test_scan_into_a_closed_pipe_ends_without_a_traceback(
    tmp_path: Path, start_sim: StartSim
) -> None:
    """`watchd scan | head -1`: the reader goes away after one line; scan ends quietly
    (exit 1, nothing on stderr about a broken pipe), not with a BrokenPipeError traceback."""
    sim = start_sim()
    d = DaemonProcess(
        tmp_path, sim, identities=[("team-a", "alice")], extra={"budgets": {"running": "5m"}}
    )
    for i in range(300):
        await sim.add_chat(
            "alice", status="running", age=900, title=f"wedged turn {i} " + "x" * 200
        )
    cmd = f"{sys.executable} -m watchd scan -c {d.config_path} --json | head -c 100 >/dev/null"
    done = await asyncio.to_thread(
        subprocess.run, ["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True
    )
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 1


async def test_scan_groups_what_is_stuck_by_cause(tmp_path: Path, start_sim: StartSim) -> None:
    """Chats past budget are grouped by cause in the order of precedence (stranded_tool,
    then capacity, then unknown), each cause once with its count and fix, in the text and
    in --json (per identity and fleet-wide); the exit code is still 1."""
    sim = start_sim()
    d = DaemonProcess(
        tmp_path,
        sim,
        identities=[("team-a", "alice")],
        extra={"budgets": {"running": "5m", "requires_action": "5m"}},
    )
    await sim.admin("POST", "/faults", {"capacity_roots": 1})
    plain = await sim.add_chat("alice", status="running", age=1800, title="holds the slot")
    queued = [
        await sim.add_chat("alice", status="running", age=900, title=f"queued {i}")
        for i in range(3)
    ]
    await sim.add_chat("alice", status="requires_action", age=900, title="paused tool")
    await asyncio.sleep(1.5)  # the simulator's tick applies the cap
    out = await scan(d.config_path, "--json")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    (result,) = doc["results"]
    assert result["by_cause"] == {"stranded_tool": 1, "capacity": 3, "unknown": 1}
    assert doc["causes"] == result["by_cause"]
    order = [s["cause"] for s in result["stuck"]]
    assert order == ["stranded_tool", "capacity", "capacity", "capacity", "unknown"]
    assert {s["chat_id"] for s in result["stuck"] if s["cause"] == "capacity"} == set(queued)
    assert [s["chat_id"] for s in result["stuck"] if s["cause"] == "unknown"] == [plain]
    text = (await scan(d.config_path)).stdout
    assert text.count("cause capacity (3): stuck: deployment concurrency cap reached") == 1
    assert text.index("cause stranded_tool (1)") < text.index("cause capacity (3)")
    assert text.index("cause capacity (3)") < text.index("cause unknown (1)")
    assert text.count("fix: the deployment runs as many chats as it may at once") == 1


async def test_scan_cost_reads_each_stuck_trees_spend(tmp_path: Path, start_sim: StartSim) -> None:
    """`scan --cost` prints what each stuck tree has cost (through a subagent where coderd
    would answer for a chat-tree chat's parent), marks the trees over cost.threshold_usd,
    and reads nothing without the flag."""
    sim = start_sim(scenario="trees")
    d = DaemonProcess(
        tmp_path,
        sim,
        identities=[("team-a", "alice"), ("team-b", "bob")],
        extra={"budgets": {"running": "5m"}, "cost": {"threshold_usd": 10}},
    )
    ids = {c["title"]: c["id"] for c in (await sim.admin("GET", "/state"))["chats"]}
    plain = await scan(d.config_path, "--json")
    assert all(r["costs"] is None for r in json.loads(plain.stdout)["results"])
    out = await scan(d.config_path, "--json", "--cost")
    assert out.returncode == 1, out.stderr
    costs = {c["tree"]: c for r in json.loads(out.stdout)["results"] for c in r["costs"]}
    assert costs[ids["tree: costly"]]["total_cost_usd"] == 42.0
    assert set(costs[ids["tree: costly"]]["past_budget"]) == {
        ids["tree: costly"],
        ids["tree: costly/worker"],
    }
    assert costs[ids["bob: pricey"]]["over_threshold"] is True
    assert costs[ids["bob: cheap"]]["over_threshold"] is False
    text = await scan(d.config_path, "--cost")
    assert "$42.00 (310 requests, 2 unpriced)  OVER cost.threshold_usd" in text.stdout
