"""The top-level Dockerfile built and run under a real container runtime (a private dockerd).

The simulator runs from the same image on a user network of its own; nothing is published
to the host. The daemon's config and secret are the sidecar manifest's, rendered as the
kubelet mounts them (tests/system/kubelet.py) and bind-mounted at the manifest's paths,
state on a named volume. Tests run in file order and share the engine and image.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.system import kubelet
from tests.system.engine import IMAGE, LABEL, Engine, Unavailable, available
from tests.system.machine import rootfs

_why = available()
pytestmark = [
    pytest.mark.system,
    pytest.mark.timeout(600),
    pytest.mark.skipif(_why is not None, reason=_why or ""),
]

SIDECAR = kubelet.ROOT / "deploy" / "kubernetes" / "sidecar" / "sidecar.yaml"
NET = "watchd-test-net"
VOLUME = "watchd-test-state"

PROBE = """
import json, sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1], timeout=3) as r:
        print(r.status); print(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode())
"""


class Stack:
    def __init__(self, engine: Engine, pod: kubelet.Pod, run_args: list[str]) -> None:
        self.engine = engine
        self.pod = pod
        self.run_args = run_args

    def get(self, container: str, path: str) -> tuple[int, Any]:
        """A GET from inside the daemon's container (the kubelet probes the pod's IP)."""
        r = self.engine.run(
            "exec", container, "python", "-c", PROBE, f"http://127.0.0.1:9310{path}",
            check=False, timeout=15,
        )  # fmt: skip
        code, _, text = r.stdout.partition("\n")
        if not code.strip().isdigit():
            return 0, r.stderr
        try:
            return int(code), json.loads(text)
        except ValueError:
            return int(code), text

    def sim(self, path: str, body: Any) -> Any:
        r = self.engine.run(
            "exec", "watchd-test-sim", "python", "-c",
            "import json,sys,urllib.request as u;"
            "req=u.Request('http://127.0.0.1:7080/__sim'+sys.argv[1],data=sys.argv[2].encode(),"
            "headers={'Content-Type':'application/json'});"
            "print(u.urlopen(req,timeout=5).read().decode())",
            path, json.dumps(body), timeout=15,
        )  # fmt: skip
        return json.loads(r.stdout)

    def start_daemon(self, name: str, *extra: str) -> None:
        self.engine.run("run", "-d", "--name", name, *self.run_args, *extra, IMAGE, timeout=60)

    @staticmethod
    def wait(cond: Any, *, within: float, step: float = 0.3) -> Any:
        end = time.monotonic() + within
        while True:
            value = cond()
            if value:
                return value
            if time.monotonic() > end:
                raise AssertionError(f"not within {within}s (last: {value!r})")
            time.sleep(step)

    def ready(self, name: str) -> bool:
        return self.get(name, "/readyz")[0] == 200


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    engine = Engine()
    render = Path(tempfile.mkdtemp(prefix="watchd-k8s-", dir="/var/tmp"))
    render.chmod(0o755)
    try:
        lower = rootfs()
        try:
            engine.start()
        except Unavailable as exc:
            pytest.skip(str(exc))
        engine.base(lower)
        engine.build()
        print(f"engine timings: {engine.timings}")
        labels = ["--label", LABEL]
        engine.run("network", "create", "--internal", *labels, NET)
        engine.run("volume", "create", *labels, VOLUME)
        engine.run(
            "run", "-d", "--name", "watchd-test-sim", *labels, "--network", NET,
            "--read-only", "--user", "10001:10001", "--cap-drop", "ALL",
            IMAGE, "sim", "--listen", "0.0.0.0:7080", "--scenario", "empty", "--seed", "7",
        )  # fmt: skip
        info = Stack.wait(lambda: _sim_info(engine), within=20)
        pod = kubelet.load(SIDECAR)
        kubelet.prepare(
            pod,
            render,
            url="http://watchd-test-sim:7080",
            tokens=[i["token"] for i in info["identities"]],
            listen=None,  # the manifest's 0.0.0.0:9310, inside the container only
            move_paths=False,
        )
        run_args = [
            *labels, "--network", NET,
            "--user", f"{pod.uid}:{pod.gid}",
            *[a for g in pod.groups if g != pod.gid for a in ("--group-add", str(g))],
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            # The image's HEALTHCHECK command, polled sooner than its 30 s interval.
            "--health-interval", "2s",
        ]  # fmt: skip
        if pod.read_only_root:
            run_args.append("--read-only")
        for m in pod.mounts:
            if m.path == "/var/lib/watchd":
                run_args += ["-v", f"{VOLUME}:{m.path}"]
            else:
                run_args += ["-v", f"{m.host}:{m.path}:{'ro' if m.read_only else 'rw'}"]
        run_args += ["--stop-timeout", str(_grace(pod))]
        yield Stack(engine, pod, run_args)
    finally:
        engine.close()
        shutil.rmtree(render, ignore_errors=True)


def _grace(pod: kubelet.Pod) -> int:
    spec = next(d for d in pod.docs if d.get("kind") == "Deployment")["spec"]["template"]["spec"]
    return int(spec.get("terminationGracePeriodSeconds", 30))


def _sim_info(engine: Engine) -> dict[str, Any] | None:
    out = engine.run("logs", "watchd-test-sim", check=False).stdout
    try:
        return dict(json.loads(out.splitlines()[0]))
    except (ValueError, IndexError):
        return None


def test_image_builds_on_the_debian_base(stack: Stack) -> None:
    """The unchanged Dockerfile builds from the hashed lock; the image runs as 10001 with no
    build tools, carries the OCI labels, and its watchd names the revision it was built
    from (--version, as watchd_build_info does)."""
    from watchd.buildinfo import revision

    cfg = stack.engine.inspect(IMAGE)["Config"]
    labels = cfg["Labels"]
    assert labels["org.opencontainers.image.revision"] == revision() != "unknown"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.version"] and labels["org.opencontainers.image.created"]
    version = stack.engine.run("run", "--rm", IMAGE, "--version").stdout
    assert f"(revision {revision()[:12]})" in version
    assert cfg["User"] == "10001:10001"
    assert cfg["Healthcheck"]["Test"][0] == "CMD"
    r = stack.engine.run(
        "run", "--rm", "--entrypoint", "sh", IMAGE, "-c", "command -v gcc || echo none"
    )
    assert r.stdout.strip() == "none"


def test_runs_hardened_becomes_ready_and_healthy(stack: Stack) -> None:
    """Read-only, non-root, no capabilities, the sidecar's mounts: /readyz 200 and the
    image's HEALTHCHECK turns the container healthy."""
    stack.start_daemon("watchd-test-d1")
    stack.wait(lambda: stack.ready("watchd-test-d1"), within=30)
    health = stack.wait(
        lambda: (
            (s := stack.engine.inspect("watchd-test-d1")["State"]["Health"]["Status"]) == "healthy"
            and s
        ),
        within=30,
    )
    assert health == "healthy"
    state = stack.engine.inspect("watchd-test-d1")
    assert state["HostConfig"]["ReadonlyRootfs"] is True
    assert state["HostConfig"]["CapDrop"] == ["ALL"]
    uid = stack.engine.run("exec", "watchd-test-d1", "id", "-u").stdout.strip()
    assert uid == "10001"


def test_restart_keeps_state_on_the_volume(stack: Stack) -> None:
    """docker restart: the firing alert and every clock come back from the named volume,
    and nothing is paged again."""
    name = "watchd-test-d1"
    # Past the sidecar's (default) 30 min running budget already: it fires on the seed.
    chat = stack.sim("/chats", {"owner": "alice", "status": "running", "age": 7200})["id"]

    def firing() -> list[dict[str, Any]]:
        code, doc = stack.get(name, "/status")
        return [
            a for a in (doc["alerts"]["firing"] if code == 200 else [])
            if a["labels"].get("chat_id") == chat
        ]  # fmt: skip

    before = stack.wait(firing, within=30)
    time.sleep(1.5)  # a state flush
    seen = stack.get(name, "/status")[1]
    stack.engine.run("restart", "-t", str(_grace(stack.pod)), name, timeout=60)
    stack.wait(lambda: stack.ready(name), within=30)
    doc = stack.get(name, "/status")[1]
    assert doc["store"]["chats"] == seen["store"]["chats"]
    assert doc["counters"].get("fired", 0) == 0
    assert firing()[0]["starts_at"] == before[0]["starts_at"]
    restarts = stack.engine.inspect(name)["RestartCount"]
    assert restarts == 0  # a docker restart, not a crash


def test_nothing_is_written_outside_the_state_volume(stack: Stack) -> None:
    """Even with a writable root the daemon writes nothing but its volume (docker diff)."""
    # A volume of its own: the state directory is locked by its one writer (d1).
    stack.engine.run("volume", "create", "--label", LABEL, VOLUME + "-2")
    writable = [
        VOLUME + "-2:/var/lib/watchd" if a == f"{VOLUME}:/var/lib/watchd" else a
        for a in stack.run_args
        if a != "--read-only"
    ]
    assert VOLUME + "-2:/var/lib/watchd" in writable
    stack.engine.run("run", "-d", "--name", "watchd-test-d2", *writable, IMAGE, timeout=60)
    try:
        stack.wait(lambda: stack.ready("watchd-test-d2"), within=30)
        time.sleep(3)  # a state flush and a reconcile
        diff = [
            line.split(" ", 1)
            for line in stack.engine.run("diff", "watchd-test-d2").stdout.splitlines()
        ]
        # The runtime makes the mount points (and their parents) for the volumes: not ours.
        points = {m.path for m in stack.pod.mounts}
        ours = [
            (kind, path) for kind, path in diff
            if not any(p == path or p.startswith(path.rstrip("/") + "/") for p in points)
        ]  # fmt: skip
        assert ours == []
    finally:
        stack.engine.run("rm", "-f", "watchd-test-d2", check=False)


def test_docker_stop_exits_zero_within_grace(stack: Stack) -> None:
    """docker stop (SIGTERM) ends the daemon with exit code 0 well inside the grace."""
    name = "watchd-test-d1"
    t0 = time.monotonic()
    stack.engine.run("stop", "-t", str(_grace(stack.pod)), name, timeout=60)
    took = time.monotonic() - t0
    state = stack.engine.inspect(name)["State"]
    print(f"docker stop took {took:.2f}s")
    assert state["ExitCode"] == 0 and not state["OOMKilled"]
    assert took < 10
