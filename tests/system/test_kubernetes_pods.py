"""Both manifests' pods as the kubelet would run them: mounts, ownership, uid, probes."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.e2e.harness import SimProcess, free_port
from tests.system import kubelet
from tests.system.conftest import skip_unless

pytestmark = [
    pytest.mark.system,
    pytest.mark.timeout(180),
    skip_unless(root=True, tools=("setpriv", "unshare")),
]

MANIFESTS = kubelet.ROOT / "deploy" / "kubernetes"
CLOSED = "http://127.0.0.1:9/"  # the discard port: nothing listens, nothing leaves


class PodFailed(AssertionError):
    pass


@pytest.fixture
def pod_root() -> Iterator[Path]:
    # Not under pytest's tmp_path: that is root-only (0700), a pod's uid could not enter.
    root = Path(tempfile.mkdtemp(prefix="watchd-pod-", dir="/var/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def sim() -> Iterator[SimProcess]:
    s = SimProcess(scenario="empty").start()
    yield s
    s.stop()


def _moved(value: Any, pod: kubelet.Pod) -> Any:
    """Container paths under a mount point → where that volume is rendered here."""
    if isinstance(value, dict):
        return {k: _moved(v, pod) for k, v in value.items()}
    if isinstance(value, list):
        return [_moved(v, pod) for v in value]
    if isinstance(value, str) and value.startswith("/") and pod.mount_for(value):
        return str(pod.host_path(value))
    return value


def _prepare(pod: kubelet.Pod, root: Path, sim: SimProcess) -> tuple[list[str], str]:
    """Render the pod's volumes with local endpoints; return the argv and the listen."""
    args = list(pod.container.get("args") or [])
    config_path = args[args.index("-c") + 1]
    cfg_mount = pod.mount_for(config_path)
    assert cfg_mount is not None and cfg_mount.kind == "configMap", config_path
    volumes = {
        v["name"]: v
        for d in pod.docs
        if d.get("kind") == "Deployment"
        for v in d["spec"]["template"]["spec"]["volumes"]
    }
    cm = pod.config_map(volumes[cfg_mount.name]["configMap"]["name"])
    key = Path(config_path).name
    cfg = yaml.safe_load(cm[key])
    values: dict[str, dict[str, str]] = {}

    def secret_value(path: str, value: str) -> None:
        m = pod.mount_for(path)
        assert m is not None and m.kind == "secret", f"{path} is on no Secret volume"
        values.setdefault(m.name, {})[Path(path).name] = value + "\n"

    for ident, sim_ident in zip(cfg["identities"], sim.identities, strict=False):
        ident["url"] = sim.url
        secret_value(ident["token_file"], sim_ident["token"])
    for r in cfg.get("receivers", []):
        if "pagerduty" in r:
            r["pagerduty"]["url"] = CLOSED
        if "slack" in r:
            secret_value(r["slack"]["webhook_url_file"], CLOSED)

    # Any other secret file the config references (an admin token, say): a made-up value.
    def refs(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            for k, v in node.items():
                if k.endswith("_file") and isinstance(v, str):
                    yield v
                yield from refs(v)
        elif isinstance(node, list):
            for v in node:
                yield from refs(v)

    for path in refs(cfg):
        m = pod.mount_for(path)
        if m is not None and m.kind == "secret" and Path(path).name not in values.get(m.name, {}):
            secret_value(path, secrets.token_hex(16))
    listen = f"127.0.0.1:{free_port()}"
    cfg["server"]["listen"] = listen
    # The rendered config keeps the manifest's paths but for the render root.
    kubelet.place(pod, root)
    values.setdefault(cfg_mount.name, {})[key] = yaml.safe_dump(_moved(cfg, pod))
    kubelet.render(pod, root, values=values)
    argv = [kubelet.PYTHON, "-m", "watchd", "--log-format", "json"]
    argv += [str(pod.host_path(a)) if a == config_path else a for a in args]
    return argv, listen


def _tail(log: Path) -> str:
    return log.read_text()[-600:]


async def _get(listen: str, path: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://{listen}{path}", timeout=aiohttp.ClientTimeout(total=3)) as r,
    ):
        return r.status, await r.json()


def _startup_budget(pod: kubelet.Pod) -> float:
    """The startupProbe's patience, capped for the test (the probe is what kills a pod)."""
    probe = pod.container["startupProbe"]
    assert probe["httpGet"]["path"] == "/readyz"
    return min(60.0, probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3))


async def _run_pod(
    manifest: Path, root: Path, sim: SimProcess, log: Path, *, revoke: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Start the pod's watchd as the kubelet would; fail as a crash loop would."""
    pod = kubelet.load(manifest)
    argv, listen = _prepare(pod, root, sim)
    for username in revoke:
        await sim.admin("POST", f"/users/{username}/revoke")
    proc = kubelet.start(pod, argv, log=log)
    result: dict[str, Any] = {"pod": pod}
    try:
        started = time.monotonic()
        deadline = started + _startup_budget(pod)
        while True:
            if proc.poll() is not None:
                raise PodFailed(
                    f"{manifest.name}: watchd exited {proc.returncode} before its startupProbe "
                    f"passed (a crash loop): {_tail(log)}"
                )
            with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                code, body = await _get(listen, "/readyz")
                if code == 200:
                    result["readyz"] = body
                    break
            if time.monotonic() > deadline:
                raise PodFailed(f"{manifest.name}: /readyz not 200 within the startupProbe")
            await asyncio.sleep(0.2)
        result["ready_after"] = time.monotonic() - started
        result["healthz"] = await _get(listen, "/healthz")
        result["status"] = (await _get(listen, "/status"))[1]
    finally:
        grace = float(
            next(d for d in pod.docs if d.get("kind") == "Deployment")["spec"]["template"][
                "spec"
            ].get("terminationGracePeriodSeconds", 30)
        )
        t0 = time.monotonic()
        result["exit"] = kubelet.stop(proc, grace)
        result["stop_seconds"] = time.monotonic() - t0
    return result


@pytest.mark.parametrize("name", ["sidecar.yaml", "deployment.yaml"])
async def test_pod_reads_its_mounts_starts_and_stops(
    name: str, pod_root: Path, sim: SimProcess, tmp_path: Path
) -> None:
    """As the kubelet mounts it, the pod reads its Secret and ConfigMap, passes its startup
    and liveness probes, keeps state on its volume as its uid, and exits 0 within grace."""
    r = await _run_pod(MANIFESTS / name, pod_root, sim, tmp_path / "pod.log")
    pod: kubelet.Pod = r["pod"]
    assert r["readyz"] == {"ready": True}
    assert r["healthz"] == (200, {"ok": True})
    assert all(i["state"] == "ready" for i in r["status"]["identities"])
    assert r["exit"] == 0 and r["stop_seconds"] < 10
    state = pod.host_path("/var/lib/watchd") / "watchd.sqlite3"
    assert state.stat().st_uid == pod.uid
    for m in pod.mounts:
        if m.kind == "secret":
            for f in (m.host / kubelet.TS_DIR).iterdir():
                assert f.stat().st_mode & 0o007 == 0, f"{f} is readable by others"


async def test_sidecar_without_fs_group_is_a_crash_loop(
    pod_root: Path, sim: SimProcess, tmp_path: Path
) -> None:
    """The shipped 0.1 sidecar (uid 10001, Secret 0400, no fsGroup) cannot read its token:
    the check above fails on it, so it would have caught the defect."""
    text = (MANIFESTS / "sidecar.yaml").read_text()
    old = "\n".join(line for line in text.splitlines() if "fsGroup:" not in line)
    assert old != text, "sidecar.yaml sets no fsGroup any more: update this test"
    manifest = tmp_path / "sidecar-0.1.yaml"
    manifest.write_text(old)
    with pytest.raises(PodFailed, match=r"cannot be read \(PermissionError\)"):
        await _run_pod(manifest, pod_root, sim, tmp_path / "pod.log")


async def test_revoked_token_does_not_hold_the_pod_back(
    pod_root: Path, sim: SimProcess, tmp_path: Path
) -> None:
    """With one of two tokens revoked the startupProbe still passes soon (the failed first
    attempt counts), and /status names the identity that could not be seeded."""
    r = await _run_pod(
        MANIFESTS / "deployment.yaml", pod_root, sim, tmp_path / "pod.log", revoke=("bob",)
    )
    assert r["readyz"] == {"ready": True, "unseeded": ["team-b"]}
    assert r["ready_after"] < 15
    states = {i["name"]: i["state"] for i in r["status"]["identities"]}
    assert states == {"team-a": "ready", "team-b": "auth_failed"}
    assert r["exit"] == 0
