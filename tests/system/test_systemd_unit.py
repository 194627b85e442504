"""The shipped unit under a booted systemd (systemd-nspawn -b of a Debian rootfs).

Inside the machine: the daemon installed from this tree's wheel at the unit's paths,
``watchd sim`` as a second unit, and ``systemd/watchd.service`` itself with one drop-in
that shortens ``WatchdogSec`` (its paths are the unit's own). Tests run in file order on
one machine; each brings the service to the state it needs first.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.system.conftest import skip_unless
from tests.system.machine import ROOT, Machine, rootfs, wheelhouse

pytestmark = [
    pytest.mark.system,
    pytest.mark.timeout(300),
    skip_unless(root=True, tools=("systemd-nspawn", "debootstrap", "nsenter", "chroot")),
]

SIM = "127.0.0.1:7080"  # inside the machine's own network namespace
LISTEN = "127.0.0.1:9310"
WATCHDOG = 3  # seconds, the drop-in's WatchdogSec
SLOW = 3.0  # the simulator's latency while the service starts

SIM_UNIT = """[Unit]
Description=Coder simulator for the watchd unit test
[Service]
ExecStart=/opt/watchd/bin/watchd sim --listen {sim} --scenario empty --seed 7
StandardOutput=file:/run/watchd-sim.json
"""
DROP_IN = f"""[Service]
# The test's only change to the shipped unit: a watchdog it can wait for.
WatchdogSec={WATCHDOG}s
"""

HTTP = """
import json, sys, urllib.request, urllib.error
method, url = sys.argv[1], sys.argv[2]
body = sys.argv[3].encode() if len(sys.argv) > 3 else None
req = urllib.request.Request(url, data=body, method=method,
                             headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=5) as r:
        print(r.status); print(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode())
"""


class Box:
    """The booted machine with watchd installed, and helpers to talk to it."""

    def __init__(self, m: Machine) -> None:
        self.m = m
        self.token = ""

    def http(self, method: str, url: str, body: Any = None) -> tuple[int, Any]:
        args = [method, url] + ([json.dumps(body)] if body is not None else [])
        r = self.m.run("/opt/watchd/bin/python", "-c", HTTP, *args, timeout=15)
        code, _, text = r.stdout.partition("\n")
        try:
            return int(code), json.loads(text)
        except ValueError:
            return int(code), text

    def sim(self, path: str, body: Any = None) -> Any:
        code, doc = self.http("POST", f"http://{SIM}/__sim{path}", body or {})
        assert code == 200, doc
        return doc

    def watchd(self, path: str) -> tuple[int, Any]:
        return self.http("GET", f"http://{LISTEN}{path}")

    def show(self, *props: str) -> dict[str, str]:
        r = self.m.run("systemctl", "show", "watchd", *[f"-p{p}" for p in props])
        return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)

    def systemctl(self, *args: str, timeout: float = 60.0) -> float:
        t0 = time.monotonic()
        r = self.m.run("systemctl", *args, timeout=timeout, check=False)
        took = time.monotonic() - t0
        if r.returncode != 0:
            log = self.m.run(
                "journalctl", "-u", "watchd", "-n", "25", "-o", "cat", "--no-pager", check=False
            ).stdout
            raise AssertionError(f"systemctl {' '.join(args)}: {r.stderr.strip()}\n{log}")
        return took

    def write_config(self, extra_identities: int = 0) -> None:
        idents = [
            {
                "name": "team-a" + (f"-{i}" if i else ""),
                "url": f"http://{SIM}",
                "token_credential": "team-a",
                "unhealthy_after": "30s",
            }
            for i in range(1 + extra_identities)
        ]
        cfg = {
            "identities": idents,
            "budgets": {"running": "3s", "default": "1h"},
            "reconcile_interval": "5s",  # the minimum
            "receivers": [{"name": "journal", "console": {}}],
            "route": {"receiver": "journal"},
            "server": {"listen": LISTEN},
        }
        path = self.m.root / "etc/watchd/watchd.yaml"
        path.write_text(yaml.safe_dump(cfg))
        path.chmod(0o644)

    def ensure_active(self) -> None:
        if self.show("ActiveState")["ActiveState"] != "active":
            self.systemctl("start", "watchd")
        self.wait(lambda: self.watchd("/readyz")[0] == 200, within=20)

    @staticmethod
    def wait(cond: Any, *, within: float, step: float = 0.3) -> Any:
        end = time.monotonic() + within
        while True:
            value = cond()
            if value:
                return value
            if time.monotonic() > end:
                raise AssertionError(f"not within {within}s")
            time.sleep(step)

    def firing(self) -> list[dict[str, Any]]:
        code, doc = self.watchd("/status")
        return list(doc["alerts"]["firing"]) if code == 200 else []

    def clocks(self) -> dict[str, tuple[float, str]]:
        # DynamicUser: the state directory lives under /var/lib/private.
        src = self.m.root / "var/lib/private/watchd/watchd.sqlite3"
        db = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
        try:
            return {c: (s, k) for c, s, k in db.execute("SELECT chat_id, since, clock FROM chats")}
        finally:
            db.close()


@pytest.fixture(scope="module")
def box() -> Iterator[Box]:
    m = Machine(rootfs(), f"watchd-unit-{int(time.time()) % 100000}")
    try:
        m.mount()
        why = m.cannot_run()
        if why:
            pytest.skip(why)
        root = m.root
        wheelhouse(root / "tmp/wheels")
        m.chroot("python3", "-m", "venv", "/opt/watchd")
        m.chroot(
            "/opt/watchd/bin/pip", "install", "-q", "--no-index",
            "--find-links", "/tmp/wheels", "watchd", timeout=300,
        )  # fmt: skip
        shutil.rmtree(root / "tmp/wheels")
        (root / "usr/local/bin/watchd").symlink_to("/opt/watchd/bin/watchd")
        units = root / "etc/systemd/system"
        shutil.copy(ROOT / "systemd" / "watchd.service", units / "watchd.service")
        (units / "watchd.service.d").mkdir()
        (units / "watchd.service.d/test.conf").write_text(DROP_IN)
        (units / "watchd-sim.service").write_text(SIM_UNIT.format(sim=SIM))
        (units / "multi-user.target.wants").mkdir(exist_ok=True)
        (units / "multi-user.target.wants/watchd-sim.service").symlink_to(
            "/etc/systemd/system/watchd-sim.service"
        )
        m.boot()
        box = Box(m)
        sim_info = box.wait(lambda: _sim_info(m), within=20)
        box.token = next(i["token"] for i in sim_info["identities"] if i["username"] == "alice")
        creds = root / "etc/watchd/credentials"
        creds.mkdir(parents=True)
        # As docs/systemd.md installs it: one file per secret the config names, here only
        # the token (no PagerDuty or Slack file: the unit must start without them).
        (creds / "team-a").write_text(box.token + "\n")
        (creds / "team-a").chmod(0o600)
        box.write_config()
        yield box
    finally:
        m.close()


def _sim_info(m: Machine) -> dict[str, Any] | None:
    """The simulator's first stdout line (in the machine's /run, a tmpfs of its own)."""
    r = m.run("cat", "/run/watchd-sim.json", check=False)
    try:
        return dict(json.loads(r.stdout.splitlines()[0]))
    except (ValueError, IndexError):
        return None


def test_machine_boots_and_the_unit_verifies(box: Box) -> None:
    """The Debian machine boots under nspawn, and systemd-analyze verify inside is clean."""
    assert box.m.boot_seconds < 60
    box.m.run("test", "-f", "/etc/systemd/system/watchd.service")
    r = box.m.run("systemd-analyze", "verify", "/etc/systemd/system/watchd.service", check=False)
    problems = [
        line
        for line in (r.stdout + r.stderr).splitlines()
        if "watchd" in line and "sim" not in line
    ]
    assert r.returncode == 0 and problems == [], r.stdout + r.stderr


def test_verify_inside_catches_what_a_minimal_system_lacks(box: Box) -> None:
    """The same verify fails on 0.1's unit (ExecReload=/bin/kill: no procps here; a man:
    link: no man here), so the clean verify above is not vacuous."""
    old = (ROOT / "systemd" / "watchd.service").read_text()
    old = re.sub(r"^ExecReload=.*$", "ExecReload=/bin/kill -HUP $MAINPID", old, flags=re.M)
    old = re.sub(
        r"^Documentation=(.*)$", r"Documentation=\1 man:systemd.service(5)", old, flags=re.M
    )
    d = box.m.root / "var/tmp/unit-0.1"  # not /tmp: a tmpfs of the machine's once booted
    d.mkdir(exist_ok=True)
    (d / "watchd.service").write_text(old)
    unit = "/var/tmp/unit-0.1/watchd.service"
    box.m.run("test", "-f", unit)  # verify of a missing file says nothing and exits 0
    r = box.m.run("systemd-analyze", "verify", unit, check=False)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "Command /bin/kill is not executable" in out, out
    assert "man systemd.service(5)" in out, out


def test_security_exposure_inside(box: Box) -> None:
    """systemd-analyze security rates the real, loaded unit at 2.0 or better."""
    r = box.m.run("systemd-analyze", "security", "watchd", "--no-pager", check=False)
    m = re.search(r"Overall exposure level for watchd\.service: (\d+\.\d+)", r.stdout)
    assert m, r.stdout[-800:]
    print(f"exposure inside: {m.group(1)}")
    assert float(m.group(1)) <= 2.0


def test_start_returns_only_after_ready(box: Box) -> None:
    """With a slow Coder, systemctl start blocks until READY=1 (after the first seed
    attempt), then /readyz is already 200 and the status line is in systemctl status."""
    box.sim("/faults", {"latency": SLOW})
    try:
        took = box.systemctl("start", "watchd")
    finally:
        box.sim("/faults", {"latency": 0})
    p = box.show("ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic")
    ready_after = (
        int(p["ActiveEnterTimestampMonotonic"]) - int(p["ExecMainStartTimestampMonotonic"])
    ) / 1e6
    print(f"systemctl start took {took:.2f}s; READY=1 {ready_after:.2f}s after exec")
    assert ready_after >= SLOW and took >= SLOW
    assert box.watchd("/readyz")[0] == 200
    status = box.m.run("systemctl", "status", "watchd", "--no-pager", check=False).stdout
    assert re.search(r'Status: "team-a ready \(0\); 0 alerts firing"', status), status


def test_the_daemon_gets_the_units_file_descriptor_limit(box: Box) -> None:
    """LimitNOFILE= reaches the running daemon: its soft limit is its hard one (65 536, or
    what the machine allows), not systemd's default 1 024, and the start-up line says so."""
    box.ensure_active()
    pid = box.show("MainPID")["MainPID"]
    limits = box.m.run("cat", f"/proc/{pid}/limits").stdout
    m = re.search(r"^Max open files\s+(\d+)\s+(\d+)", limits, re.M)
    # 65 536, or the most the machine the unit boots on allows (a container's own hard
    # limit caps what LimitNOFILE= can give: 20 000 in some sandboxes).
    assert m and int(m.group(1)) == int(m.group(2)) > 1024, limits
    log = box.m.run("journalctl", "-u", "watchd", "-o", "cat", "--no-pager", check=False).stdout
    assert f'"soft": {m.group(1)}' in log and "process.fd_limit" in log, log[-800:]


def test_journal_priorities_follow_the_log_levels(box: Box) -> None:
    """Under systemd each line reaches the journal at its level's priority: `journalctl
    -p warning` shows the daemon's warnings (the fd-limit line is info, not among them)."""
    box.ensure_active()
    box.sim("/drop-watch", {"code": 1011})  # the stream drops: watch.lost, a warning
    time.sleep(3)
    warn = box.m.run(
        "journalctl", "-u", "watchd", "-p", "warning", "-o", "cat", "--no-pager", check=False
    ).stdout
    everything = box.m.run("journalctl", "-u", "watchd", "-o", "cat", "--no-pager").stdout
    assert '"level": "warning"' in warn, warn[-800:]
    assert "process.fd_limit" in everything and "process.fd_limit" not in warn
    assert "<4>" not in everything  # journald took the prefix as the priority


def test_credentials_are_0400_and_owned_by_the_dynamic_user(box: Box) -> None:
    """The credentials directory is loaded whole, whatever it holds (only a token here: no
    Slack or PagerDuty file, and the unit runs): each file arrives as watchd_<file>, mode
    0400, owned by the service's dynamic uid, and token_credential: team-a finds it."""
    box.ensure_active()
    pid = box.show("MainPID")["MainPID"]
    uid = re.search(r"^Uid:\s+(\d+)", box.m.run("cat", f"/proc/{pid}/status").stdout, re.M)
    assert uid and int(uid.group(1)) >= 61184, "not a DynamicUser uid"  # systemd's range
    listing = box.m.run("ls", "/run/credentials/watchd.service").stdout.split()
    assert listing == ["watchd_team-a"], listing
    r = box.m.run("stat", "-c", "%a %u", "/run/credentials/watchd.service/watchd_team-a")
    assert r.stdout.split() == ["400", uid.group(1)]


def test_restart_keeps_clocks_and_firing_alerts(box: Box) -> None:
    """DynamicUser + StateDirectory: after systemctl restart every chat keeps its clock,
    the firing alert is still firing, and nothing is paged again."""
    box.ensure_active()
    chat = box.sim("/chats", {"owner": "alice", "status": "running", "age": 120})["id"]
    fired = box.wait(
        lambda: [a for a in box.firing() if a["labels"].get("chat_id") == chat], within=20
    )
    box.sim("/chats", {"owner": "alice", "status": "requires_action"})
    time.sleep(2)  # a state flush
    before = box.clocks()
    box.systemctl("restart", "watchd")
    box.wait(lambda: box.watchd("/readyz")[0] == 200, within=20)
    time.sleep(6)  # past the budget and a reconcile: a second page would happen here
    code, doc = box.watchd("/status")
    assert code == 200
    again = [a for a in doc["alerts"]["firing"] if a["labels"].get("chat_id") == chat]
    assert again and again[0]["starts_at"] == fired[0]["starts_at"]
    assert doc["counters"].get("fired", 0) == 0, "the restarted daemon paged again"
    after = box.clocks()
    assert {c: after[c] for c in before} == before


def test_reload_applies_a_changed_config(box: Box) -> None:
    """systemctl reload (the unit's ExecReload, no procps in the machine) applies a new
    identity in the same process."""
    box.ensure_active()
    pid = box.show("MainPID")["MainPID"]
    assert not (box.m.root / "bin/kill").exists() and not (box.m.root / "usr/bin/kill").exists()
    box.write_config(extra_identities=1)
    try:
        box.systemctl("reload", "watchd")
        box.wait(lambda: len(box.watchd("/status")[1]["identities"]) == 2, within=15)
        assert box.show("MainPID")["MainPID"] == pid
    finally:
        box.write_config()
        box.systemctl("reload", "watchd")


def test_watchdog_restarts_a_stopped_daemon(box: Box) -> None:
    """kill -STOP of the main process: systemd's watchdog fires and restarts the service."""
    box.ensure_active()
    p = box.show("MainPID", "NRestarts")
    box.m.run("sh", "-c", f"kill -STOP {p['MainPID']}")  # no procps: the shell's kill
    t0 = time.monotonic()
    box.wait(
        lambda: (
            (q := box.show("MainPID", "NRestarts", "ActiveState"))["NRestarts"] != p["NRestarts"]
            and q["ActiveState"] == "active"
            and q["MainPID"] not in ("0", p["MainPID"])
        ),
        within=60,
    )
    print(f"watchdog restart after {time.monotonic() - t0:.1f}s")
    journal = box.m.run("journalctl", "-u", "watchd", "--no-pager").stdout
    assert "Watchdog timeout" in journal


def test_stop_is_clean_and_quick(box: Box) -> None:
    """systemctl stop: SIGTERM, exit status 0, well inside TimeoutStopSec."""
    box.ensure_active()
    took = box.systemctl("stop", "watchd")
    p = box.show("Result", "ExecMainStatus", "ActiveState")
    print(f"systemctl stop took {took:.2f}s")
    assert (p["Result"], p["ExecMainStatus"], p["ActiveState"]) == ("success", "0", "inactive")
    assert took < 10
