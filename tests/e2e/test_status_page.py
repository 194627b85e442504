"""The status page as on-call sees it, rendered by headless Chromium: firing alerts with
"firing since", silenced ones marked and collapsed, receiver health, recently resolved,
chat links into Coder, filters, and a last-hour chart per identity. The screenshot is kept
in test-artifacts/status-page.png."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from tests.e2e import browser
from tests.e2e.browser import ARTIFACTS
from tests.e2e.harness import DaemonProcess, SimProcess, eventually, free_port

StartSim = Callable[..., SimProcess]
StartDaemon = Callable[..., DaemonProcess]


async def test_status_page_for_on_call_in_chromium(
    tmp_path: Path, start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """Chromium's DOM of /status shows what on-call needs, and a screenshot is kept."""
    sim = start_sim()
    dead = f"http://127.0.0.1:{free_port()}/hook"
    d = start_daemon(
        sim,
        extra={
            "receivers": [
                {"name": "console", "console": {}},
                {"name": "hook", "webhook": {"url": dead, "timeout": "1s"}},
            ],
            "route": {
                "receiver": "console",
                "group_wait": "0s",
                "group_interval": "1s",
                "routes": [{"matchers": ['alertname="ChatStuck"'], "receiver": "hook",
                            "continue": True}],
            },
            "silences": [
                {
                    "matchers": ['alertname="ChatStranded"'],
                    "ends_at": "2099-01-01T00:00:00Z",
                    "comment": "known client-tool outage",
                }
            ],
        },
    )  # fmt: skip
    await d.wait_ready()
    stuck = await sim.add_chat("alice", status="running", title="Render <b>me</b> safely")
    stranded = await sim.add_chat("alice", status="requires_action", title="paused tool")
    ended = await sim.add_chat("alice", status="running", title="finishes later")

    async def three() -> bool:
        return len(await d.firing()) >= 3

    await eventually(three, within=15)
    await sim.set_status(ended, "waiting")
    await eventually(lambda: d.resolved("ChatStuck"), within=10)

    async def hook_failed() -> bool:
        return bool((await d.status())["receivers"]["hook"]["last_failure"])

    await eventually(hook_failed, within=20)
    url = f"http://{d.listen}/status?format=html"
    page = await browser.dom(tmp_path, url)
    # Firing, with "firing since" and the chat linked to Coder's UI.
    assert re.search(r"<table id=\"alerts\">.*ChatStuck.*</table>", page, re.S)
    assert "firing since" in page and "<time datetime=" in page
    assert f'href="{sim.url}/agents/{stuck}"' in page
    assert "Render &lt;b&gt;me&lt;/b&gt; safely" in page
    # The silenced one is in the collapsed block, marked.
    muted = page.split('<details id="muted">', 1)[1].split("</details>", 1)[0]
    assert stranded in muted or "paused tool" in muted
    assert 'class="badge silenced"' in muted and "1 silenced" in muted
    # Receiver health: the dead webhook's failure, its error and its pending retry.
    hook = re.search(r'<tr class="receiver bad" data-receiver="hook">(.*?)</tr>', page, re.S)
    assert hook, page[:2000]
    assert "never" in hook.group(1) and "ago" in hook.group(1)
    assert "network error" in hook.group(1)
    assert re.search(r"<td>[1-9]\d*</td><td>\d+</td><td>\d+</td>$", hook.group(1))
    # Recently resolved, saying how long and why.
    resolved = page.split('<table id="resolved">', 1)[1].split("</table>", 1)[0]
    assert "finishes later" in resolved and "left running for waiting" in resolved
    # Filters and the chart.
    assert '<select name="identity">' in page and '<option value="team-a">' in page
    assert '<select name="alertname">' in page
    assert '<svg class="chart" data-identity="team-a"' in page and "<polyline" in page
    assert sim.token("alice") not in page
    await browser.screenshot(tmp_path, url, "status-page.png")


async def test_filter_by_identity_and_alert_name(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """?identity= and ?alertname= narrow the rows (and the JSON) without a JS framework."""
    sim = start_sim()
    d = start_daemon(sim, identities=[("team-a", "alice"), ("team-b", "bob")])
    await d.wait_ready()
    await sim.add_chat("alice", status="running")
    await sim.add_chat("bob", status="requires_action")

    async def two() -> bool:
        return len(await d.firing()) >= 2

    await eventually(two, within=15)
    _, doc = await d.get("/status?identity=team-b")
    assert [a["labels"]["identity"] for a in doc["alerts"]["firing"]] == ["team-b"]
    assert doc["alerts"]["firing_total"] == 2 and doc["alerts"]["matching"] == 1
    _, page = await d.get("/status?format=html&alertname=ChatStuck")
    rows = re.findall(r"<tr class='alert [^']*' data-state='\w+' data-identity='([^']+)'", page)
    assert rows == ["team-a"]


async def test_status_page_at_3am_on_a_laptop_and_on_a_phone(
    tmp_path: Path, start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """Rendered by Chromium at 1440×900 and 412×915: rows most severe first; on the phone
    the alert, chat, time in status and hint columns are visible and none overflows the
    screen, the rest are hidden; the header says which identity keeps it "not ready".
    Screenshots: test-artifacts/status-1440.png, status-412.png."""
    from tests.e2e.cdp import chromium

    sim = start_sim()
    d = start_daemon(sim, identities=[("team-a", "alice"), ("team-b", "bob")])
    await d.wait_ready()
    await sim.add_chat("alice", status="running", title="wedged " + "long title " * 4)
    await sim.add_chat("bob", status="requires_action", title="paused tool")

    async def two() -> bool:
        return len(await d.firing()) >= 2

    await eventually(two, within=15)
    await sim.admin("POST", "/users/bob/revoke")  # team-b: refused, IdentityUnhealthy
    await eventually(lambda: d.firing("IdentityUnhealthy"), within=30)
    url = f"http://{d.listen}/status?format=html"
    ARTIFACTS.mkdir(exist_ok=True)
    async with chromium(tmp_path) as page:
        await page.open(url, width=1440, height=900)
        severities = await page.eval(
            "[...document.querySelectorAll('#alerts tr.alert')].map(r => r.dataset.severity)"
        )
        rank = {"critical": 0, "warning": 1, "info": 2}
        assert severities and severities == sorted(severities, key=lambda s: rank.get(s, 3))
        assert severities[0] == "critical"  # IdentityUnhealthy
        await page.screenshot(ARTIFACTS / "status-1440.png")
        await page.open(url, width=412, height=915, mobile=True)
        shown = await page.eval(
            "Object.fromEntries([...document.querySelectorAll('#alerts tr.alert:first-child td,"
            " #alerts tr.alert td')].slice(0, 9).map(td => [td.className,"
            " getComputedStyle(td).display !== 'none']))"
        )
        assert {k for k, v in shown.items() if v} == {"sev", "name", "chat", "age", "hint"}
        wide = await page.eval("document.querySelector('#alerts').getBoundingClientRect().right")
        assert wide <= 412 + 1, wide
        await page.screenshot(ARTIFACTS / "status-412.png")
    assert (ARTIFACTS / "status-412.png").stat().st_size > 5000
