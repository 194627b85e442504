"""A private Docker engine for the image tests: its own dockerd, socket and exec root.

No registry is reachable, so the base image the Dockerfile names is imported from the
cached Debian rootfs. The data root (images, build cache) is kept under the test cache
so a second run builds from cache; a lock keeps two runs from sharing one engine.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.system.machine import CACHE, RELEASE, ROOT, sh

BASE = "python:3.11-slim-bookworm"  # the Dockerfile's FROM, built here from Debian
IMAGE = "watchd:system-test"
LABEL = "org.watchd.system-test"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # as the python images
# Debian's client matches Debian's daemon; a newer client elsewhere on PATH may not.
CLIENT = (
    "/usr/bin/docker" if Path("/usr/bin/docker").exists() else (shutil.which("docker") or "docker")
)


class Unavailable(Exception):
    """This machine cannot run the engine (a skip, with the reason)."""


class Engine:
    def __init__(self) -> None:
        self.data = CACHE / "docker"
        self.data.mkdir(parents=True, exist_ok=True)
        self._lock = (self.data / ".lock").open("w")
        self.dir = Path(tempfile.mkdtemp(prefix="watchd-dockerd-", dir="/var/tmp"))
        self.sock = self.dir / "docker.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "dockerd.log"
        self.timings: dict[str, float] = {}

    def start(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + 600
        while True:  # another run's engine on the same data root: wait for it
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise AssertionError("the test Docker data root stayed locked") from None
                time.sleep(1)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    "dockerd", "--iptables=false", "--ip-masq=false", "--bridge=none",
                    "--storage-driver=overlay2", f"--data-root={self.data / 'data'}",
                    f"--exec-root={self.dir / 'exec'}", f"--pidfile={self.dir / 'dockerd.pid'}",
                    "-H", f"unix://{self.sock}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        end = time.monotonic() + timeout
        t0 = time.monotonic()
        while self.run("info", check=False, timeout=10).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > end:
                # The engine is Debian's, not ours: one that cannot start here is a machine
                # without a container runtime.
                lines = self.log.read_text(errors="replace").strip().splitlines()
                raise Unavailable(f"dockerd does not start here: {lines[-1] if lines else '?'}")
            time.sleep(0.2)
        self.timings["dockerd_up"] = time.monotonic() - t0
        self.sweep()

    def run(
        self, *args: str, timeout: float = 60.0, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return sh(
            CLIENT, "-H", f"unix://{self.sock}", *args, timeout=timeout, check=check, input=input
        )

    def sweep(self) -> None:
        """Remove what a previous, killed run left: its containers, networks and volumes."""
        flt = f"label={LABEL}"
        ids = self.run("ps", "-aq", "--filter", flt).stdout.split()
        if ids:
            self.run("rm", "-f", *ids, check=False)
        for kind in ("network", "volume"):
            names = self.run(kind, "ls", "-q", "--filter", flt).stdout.split()
            if names:
                self.run(kind, "rm", *names, check=False)

    def base(self, rootfs: Path) -> None:
        """The Dockerfile's base: the Debian rootfs imported, unless already imported."""
        recipe = (rootfs.parent / ".recipe").read_text().strip()
        want = f"{RELEASE}-{recipe}"
        r = self.run("image", "inspect", BASE, "--format", "{{json .Config.Labels}}", check=False)
        if r.returncode == 0 and (json.loads(r.stdout) or {}).get(LABEL + ".base") == want:
            self.timings["base_import"] = 0.0
            return
        t0 = time.monotonic()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            subprocess.run(
                [
                    CLIENT, "-H", f"unix://{self.sock}", "import",
                    "--change", f"ENV PATH={PATH}",
                    "--change", 'CMD ["python3"]',
                    "--change", f"LABEL {LABEL}.base={want}",
                    "-", BASE,
                ],
                stdin=tar.stdout,
                check=True,
                timeout=300,
                capture_output=True,
            )  # fmt: skip
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait(60)
        self.timings["base_import"] = time.monotonic() - t0

    def build(self) -> None:
        """The top-level Dockerfile, unchanged, built as its header says (the host's network
        for pip; the revision of this checkout)."""
        t0 = time.monotonic()
        from watchd.buildinfo import revision

        self.run(
            "build", "--network=host", "-q", "-t", IMAGE,
            "--build-arg", f"REVISION={revision()}",
            "--build-arg", "CREATED=2026-01-01T00:00:00Z",
            str(ROOT), timeout=600,
        )  # fmt: skip
        self.timings["build"] = time.monotonic() - t0
        # The previous run's image, now untagged: the cached data root must not grow a run.
        self.run("image", "prune", "-f", timeout=120, check=False)

    def inspect(self, name: str) -> dict[str, Any]:
        return dict(json.loads(self.run("inspect", name).stdout)[0])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.sweep()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        netns = self.dir / "exec" / "netns"
        if netns.is_dir():
            for ns in netns.iterdir():
                sh("umount", "-l", str(ns), check=False, timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()


def available() -> str | None:
    """Why this machine cannot run a Docker engine, or None."""
    if os.geteuid() != 0:
        return "needs root to run dockerd"
    for tool in ("dockerd", "containerd", "runc"):
        if shutil.which(tool) is None:
            return f"not on this machine: {tool}"
    return None
