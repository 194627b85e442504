"""QuotaExhaustionForecast and GET /v1/admission with the real daemon and simulator.

alice's quota rises steadily (the simulator's ``rise_per_minute``), bob's stays flat.
Seconds stand in for minutes: quota read every second, a 20 s window, a 60 s horizon.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from tests.e2e.harness import DaemonProcess, SimProcess, eventually
from tests.e2e.test_remediation import StartDaemon, StartSim

BUDGET, START, PER_MINUTE = 200, 20, 120  # 2 credits/s: exhausted 90 s after the start
HORIZON = 60.0
TOKEN = "admission-token-0123456789abcdef"


def config(tmp_path: Path) -> dict[str, Any]:
    token_file = tmp_path / "ingest-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    return {
        "quota": {"interval": "1s", "low": "5%"},
        "forecast": {"window": "20s", "horizon": "60s"},
        "server": {"ingest_token_file": str(token_file)},
    }


async def admission(d: DaemonProcess, identity: str, *, token: str | None = TOKEN) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as s,
        s.get(
            f"http://{d.listen}/v1/admission",
            params={"identity": identity},
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=5),
        ) as r,
    ):
        return r.status, await r.json()


async def test_forecast_fires_for_a_rise_and_admission_holds_it_back(
    start_sim: StartSim, start_daemon: StartDaemon, tmp_path: Path
) -> None:
    """Rise fires (eta within 10 %), flat never; admission false/true, 404 and 401."""
    sim: SimProcess = start_sim()
    await sim.admin("POST", "/users/bob/quota", {"budget": BUDGET, "consumed": START})
    d = start_daemon(
        sim, identities=[("team-a", "alice"), ("team-b", "bob")], extra=config(tmp_path)
    )
    await d.wait_ready()
    t0 = time.time()
    await sim.admin(
        "POST",
        "/users/alice/quota",
        {"budget": BUDGET, "consumed": START, "rise_per_minute": PER_MINUTE},
    )
    t1 = time.time()
    exhausted = (t0 + t1) / 2 + (BUDGET - START) / (PER_MINUTE / 60)
    assert (await admission(d, "team-a"))[1]["admit"] is True
    fired = await eventually(lambda: d.firing("QuotaExhaustionForecast"), within=60, step=0.5)
    fired_at = time.time()
    (alert,) = fired
    assert alert["labels"]["identity"] == "team-a" and alert["labels"]["severity"] == "warning"
    a = alert["annotations"]
    assert int(a["headroom"]) > 0 and "fan-out" in a["hint"]
    eta = datetime.fromisoformat(a["eta"]).timestamp()
    error = abs(eta - exhausted) / (exhausted - fired_at)
    print(
        f"\nforecast eta error: {error:.1%} (eta {eta - exhausted:+.1f}s off, "
        f"{eta - fired_at:.1f}s after firing, {a['rate_per_hour']} credits/h)"
    )
    assert error <= 0.10
    assert abs(float(a["rate_per_hour"]) - PER_MINUTE * 60) <= 0.1 * PER_MINUTE * 60
    # It fired once the true exhaustion was within the horizon (give or take its accuracy).
    assert exhausted - fired_at <= HORIZON * 1.1

    status, held = await admission(d, "team-a")
    assert status == 200 and held["admit"] is False
    assert any(r.startswith("quota_forecast:") for r in held["reasons"])
    assert held["forecast_eta"] and held["headroom"] > 0
    status, admitted = await admission(d, "team-b")
    assert (status, admitted["admit"], admitted["reasons"]) == (200, True, [])
    assert (await admission(d, "nobody"))[0] == 404
    status, refused = await admission(d, "team-a", token=None)
    assert status == 401 and "admit" not in refused
    assert (await admission(d, "team-a", token="wrong"))[0] == 401

    doc = await d.status()
    by_name = {i["name"]: i for i in doc["identities"]}
    assert by_name["team-a"]["quota"]["forecast"]["firing"] is True
    assert by_name["team-b"]["admission"]["admit"] is True
    _, metrics = await d.get("/metrics")
    rate = re.search(r'watchd_quota_consumption_rate\{identity="team-a"\} (\S+)', str(metrics))
    assert rate is not None and abs(float(rate[1]) - PER_MINUTE * 60) <= 0.1 * PER_MINUTE * 60
    assert 'watchd_quota_exhaustion_eta_seconds{identity="team-b"} +Inf' in str(metrics)
    fired_for = {e.get("identity") for e in d.log_events() if e.get("event") == "alert.firing"}
    assert "team-b" not in fired_for and TOKEN not in d.logs()
