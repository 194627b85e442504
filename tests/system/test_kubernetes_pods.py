"""Both manifests' pods as the kubelet would run them: mounts, ownership, uid, probes."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e.harness import SimProcess, free_port
from tests.system import kubelet
from tests.system.conftest import skip_unless

pytestmark = [
    pytest.mark.system,
    pytest.mark.timeout(180),
    skip_unless(root=True, tools=("setpriv", "unshare")),
]

MANIFESTS = kubelet.ROOT / "deploy" / "kubernetes"


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


def _prepare(pod: kubelet.Pod, root: Path, sim: SimProcess) -> tuple[list[str], str]:
    """Render the pod's volumes with local endpoints; return the argv and the listen."""
    listen = f"127.0.0.1:{free_port()}"
    args = kubelet.prepare(
        pod,
        root,
        url=sim.url,
        tokens=[i["token"] for i in sim.identities],
        listen=listen,
        move_paths=True,
    )
    return [kubelet.PYTHON, "-m", "watchd", "--log-format", "json", *args], listen


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


@pytest.mark.parametrize(
    "name",
    [
        "sidecar/sidecar.yaml",
        "standalone/deployment.yaml",
        "sidecar-ha/sidecar-ha.yaml",
        "sidecar-spans/sidecar-spans.yaml",
    ],
)
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
    text = (MANIFESTS / "sidecar" / "sidecar.yaml").read_text()
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
        MANIFESTS / "standalone" / "deployment.yaml",
        pod_root,
        sim,
        tmp_path / "pod.log",
        revoke=("bob",),
    )
    assert r["readyz"] == {"ready": True, "unseeded": ["team-b"]}
    assert r["ready_after"] < 15
    states = {i["name"]: i["state"] for i in r["status"]["identities"]}
    assert states == {"team-a": "ready", "team-b": "auth_failed"}
    assert r["exit"] == 0
