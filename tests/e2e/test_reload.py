"""Reloads tell the truth: every changed setting is applied, or named as needing a restart
(logged and in /status) — never reported applied while ignored, and judged against what
runs; POST /-/reload (admin token) runs the same path for config-reloader sidecars."""

from __future__ import annotations

import asyncio
import copy
import os
import re
import shutil
import signal
import textwrap
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.e2e.harness import DaemonProcess, SimProcess, eventually, free_port

ROOT = Path(__file__).resolve().parents[2]
StartSim = Callable[..., SimProcess]
StartDaemon = Callable[..., DaemonProcess]


async def test_reload_applies_detection_sweep_and_reconcile_and_names_the_rest(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """chat_failed, sweep (enabled, dry_run), reconcile_interval and external_url take effect
    on SIGHUP; server.listen and telemetry are named as needing a restart."""
    sim = start_sim()
    d = start_daemon(sim)
    await d.wait_ready()
    await sim.add_chat("alice", status="error", title="broke")
    doc = await d.status()
    assert doc["sweep"] is None and doc["reload"]["last"] is None
    cfg = copy.deepcopy(d.config)
    cfg["detection"] = {"chat_failed": True}
    cfg["sweep"] = {"enabled": True, "dry_run": False}
    cfg["reconcile_interval"] = "7s"
    cfg["server"] = {**cfg["server"], "listen": f"127.0.0.1:{free_port()}"}
    cfg["server"]["external_url"] = "https://watchd.example.com"
    cfg["telemetry"] = {"exporter": "console"}
    d.rewrite(cfg)
    d.signal(signal.SIGHUP)

    def applied() -> dict[str, object] | None:
        return next((e for e in d.log_events() if e.get("event") == "reload.applied"), None)

    event = await eventually(applied, within=10)
    assert set(event["settings"]) == {
        "reconcile_interval",
        "detection.chat_failed",
        "sweep.enabled",
        "sweep.dry_run",
        "server.external_url",
    }
    assert event["needs_restart"] == ["server.listen", "telemetry.exporter"]
    warned = {e["setting"] for e in d.log_events() if e.get("event") == "reload.needs_restart"}
    assert warned == {"server.listen", "telemetry.exporter"}
    doc = await d.status()  # still on the old address: it was not applied
    assert doc["reload"]["last"]["needs_restart"] == ["server.listen", "telemetry.exporter"]
    assert doc["sweep"] is not None and doc["sweep"]["dry_run"] is False
    # Applied means in effect: the errored chat now alerts.
    await eventually(lambda: d.firing("ChatFailed"), within=10)


async def test_reload_of_an_unchanged_file_applies_nothing(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """SIGHUP with the same file reports no setting applied and none needing a restart."""
    sim = start_sim()
    d = start_daemon(sim)
    await d.wait_ready()
    d.signal(signal.SIGHUP)

    def applied() -> dict[str, object] | None:
        return next((e for e in d.log_events() if e.get("event") == "reload.applied"), None)

    event = await eventually(applied, within=10)
    assert event["settings"] == [] and event["needs_restart"] == []


async def test_a_reverted_listen_address_needs_no_restart_and_a_pending_one_stays_named(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """Needs-restart is judged against what runs: a second SIGHUP of a changed listen
    address names it again, and reverting it to the bound address needs nothing."""
    sim = start_sim()
    d = start_daemon(sim)
    await d.wait_ready()
    bound = d.config["server"]["listen"]
    cfg = copy.deepcopy(d.config)
    cfg["server"] = {**cfg["server"], "listen": f"127.0.0.1:{free_port()}"}
    d.rewrite(cfg)

    async def reloaded(n: int) -> dict[str, object]:
        d.signal(signal.SIGHUP)
        await eventually(lambda: _reloads(d, n), within=10)
        last = (await d.status())["reload"]["last"]
        assert isinstance(last, dict)
        return last

    assert (await reloaded(1))["needs_restart"] == ["server.listen"]
    assert (await reloaded(2))["needs_restart"] == ["server.listen"]
    cfg["server"]["listen"] = bound
    d.rewrite(cfg)
    last = await reloaded(3)
    assert last["needs_restart"] == [] and last["applied"] == []
    _, text = await d.get("/metrics")
    assert "watchd_config_last_reload_successful 1.0" in text


async def _reloads(d: DaemonProcess, n: int) -> bool:
    return int((await d.status())["reload"]["applied"]) >= n


def _admin_token(tmp: Path) -> tuple[str, dict[str, object]]:
    token = "admin-token-" + "x" * 24
    path = tmp / "admin-token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token, {"server": {"admin_token_file": str(path)}}


def _kubelet_update(volume: Path, files: dict[str, str], n: int) -> None:
    """Update a ConfigMap volume as the kubelet's AtomicWriter does: the files in a new
    timestamped directory, then ``..data`` swapped to it in one rename (the keys are links
    through ``..data``), then the old directory removed."""
    ts = f"..2026_12_02_10_00_{n:02d}.{n:09d}"
    (volume / ts).mkdir()
    for key, text in files.items():
        (volume / ts / key).write_text(text)
    old = (volume / "..data").readlink() if (volume / "..data").is_symlink() else None
    (volume / "..data_tmp").symlink_to(ts)
    os.rename(volume / "..data_tmp", volume / "..data")
    for key in files:
        if not (volume / key).is_symlink():
            tmp = volume / f"{key}.tmp"
            tmp.symlink_to(f"..data/{key}")
            os.rename(tmp, volume / key)
    if old is not None:
        shutil.rmtree(volume / old)


async def _post_reload(d: DaemonProcess, token: str | None) -> tuple[int, dict[str, object]]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://{d.listen}/-/reload", headers=headers) as r,
    ):
        return r.status, await r.json()


async def test_post_reload_applies_a_configmap_update_behind_the_admin_token(
    start_sim: StartSim, start_daemon: StartDaemon, tmp_path: Path
) -> None:
    """A config-reloader sidecar's POST /-/reload (admin token) after the kubelet swapped
    the ConfigMap volume runs the SIGHUP path: 401 without the token, 200 with what was
    applied, 400 with the problems of an invalid file (the old config kept, and
    watchd_config_last_reload_successful 0), never the token in an answer or a log."""
    sim = start_sim()
    token, admin = _admin_token(tmp_path)
    d = start_daemon(sim, extra=admin)
    await d.wait_ready()
    # The config file becomes a ConfigMap key: <volume>/watchd.yaml → ..data/watchd.yaml.
    volume = d.config_path.parent
    cfg = copy.deepcopy(d.config)
    d.config_path.unlink()
    _kubelet_update(volume, {d.config_path.name: yaml.safe_dump(cfg)}, 1)
    assert d.config_path.is_symlink()

    assert (await _post_reload(d, None))[0] == 401
    assert (await _post_reload(d, "wrong"))[0] == 401
    cfg["detection"] = {"chat_failed": True}
    _kubelet_update(volume, {d.config_path.name: yaml.safe_dump(cfg)}, 2)
    status, body = await _post_reload(d, token)
    assert status == 200, body
    assert body["status"] == "applied" and body["applied"] == ["detection.chat_failed"]
    assert body["needs_restart"] == []
    await sim.add_chat("alice", status="error", title="broke")
    await eventually(lambda: d.firing("ChatFailed"), within=10)

    _kubelet_update(volume, {d.config_path.name: "identities: [{name: x, url: ftp://n}]\n"}, 3)
    status, body = await _post_reload(d, token)
    assert status == 400 and body["status"] == "rejected"
    assert any("identities.0.url" in str(p) for p in body["problems"])  # type: ignore[union-attr]
    _, text = await d.get("/metrics")
    assert "watchd_config_last_reload_successful 0.0" in text
    assert 'watchd_config_reloads_total{outcome="rejected"} 1.0' in text
    assert (await d.status())["reload"]["last"]["applied"] == ["detection.chat_failed"]
    assert token not in d.logs()


async def test_post_reload_is_refused_without_an_admin_token_configured(
    start_sim: StartSim, start_daemon: StartDaemon
) -> None:
    """With no server.admin_token_* the endpoint answers 403 saying how to turn it on, and
    reloads nothing."""
    sim = start_sim()
    d = start_daemon(sim)
    await d.wait_ready()
    status, body = await _post_reload(d, None)
    assert status == 403 and "server.admin_token_file" in str(body["error"])
    assert (await d.status())["reload"]["applied"] == 0


def _reloader_script(volume: Path, token_file: Path, listen: str) -> str:
    """docs/kubernetes.md's config-reloader sidecar script, its pod paths pointed here."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "config-reloader" in b)
    script = str(yaml.safe_load(textwrap.dedent(block))[0]["args"][0])
    for pod, here in (
        ("/etc/watchd", str(volume)),
        ("/run/secrets/watchd/admin", str(token_file)),
        ("http://127.0.0.1:9310", f"http://{listen}"),
        ("sleep 10", "sleep 0.2"),
    ):
        assert pod in script, pod
        script = script.replace(pod, here)
    return script


async def test_the_documented_reloader_sidecar_reloads_a_swapped_configmap(
    start_sim: StartSim, start_daemon: StartDaemon, tmp_path: Path
) -> None:
    """The config-reloader script in docs/kubernetes.md, run by busybox's sh and wget,
    reloads watchd once per kubelet swap of the ConfigMap volume, with the token read from
    its file (never on its command line)."""
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox missing: tests/setup/system-deps installs it (root and apt)")
    applets = tmp_path / "bin"
    applets.mkdir()
    for name in ("sh", "wget", "readlink", "sleep", "cat", "echo", "["):
        (applets / name).symlink_to(busybox)
    sim = start_sim()
    token, admin = _admin_token(tmp_path)
    d = start_daemon(sim, extra=admin)
    await d.wait_ready()
    volume = tmp_path / "configmap"
    volume.mkdir()
    cfg = copy.deepcopy(d.config)
    _kubelet_update(volume, {"watchd.yaml": yaml.safe_dump(cfg)}, 1)
    # The daemon's -c file becomes the volume's key, as `-c /etc/watchd/watchd.yaml` is.
    d.config_path.unlink()
    d.config_path.symlink_to(volume / "watchd.yaml")
    script = _reloader_script(volume, tmp_path / "admin-token", d.listen)
    sidecar = await asyncio.create_subprocess_exec(
        str(applets / "sh"),
        "-c",
        script,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={"PATH": str(applets)},
    )
    try:
        await asyncio.sleep(1)  # a few of its polls: nothing changed, nothing asked
        assert (await d.status())["reload"]["applied"] == 0
        cfg["detection"] = {"chat_failed": True}
        _kubelet_update(volume, {"watchd.yaml": yaml.safe_dump(cfg)}, 2)
        await eventually(lambda: _reloads(d, 1), within=10)
        assert (await d.status())["reload"]["last"]["applied"] == ["detection.chat_failed"]
        await asyncio.sleep(1)
        assert (await d.status())["reload"]["applied"] == 1, "asked once per swap"
    finally:
        sidecar.terminate()
        said, _ = await sidecar.communicate()
    assert token not in script and token.encode() not in said and token not in d.logs()
