"""Real-system fixtures' plumbing: the cached Debian rootfs, a wheelhouse of the daemon,
and a booted systemd-nspawn machine driven through nsenter (machinectl and
systemd-run --machine need a host systemd, which this kind of machine lacks).

Every command has a timeout; every machine, mount and directory is removed even on failure.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RELEASE = os.environ.get("WATCHD_TEST_DEBIAN", "bookworm")
CACHE = Path(os.environ.get("WATCHD_TEST_CACHE", "/var/tmp/watchd-test-cache"))


def sh(
    *argv: str, timeout: float = 60.0, check: bool = True, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False, input=input
    )
    if check and r.returncode != 0:
        raise AssertionError(f"{argv} exited {r.returncode}: {r.stdout[-800:]}{r.stderr[-800:]}")
    return r


def rootfs() -> Path:
    """The cached Debian rootfs (built once a release by tests/setup/debian-rootfs)."""
    r = sh(str(ROOT / "tests" / "setup" / "debian-rootfs"), RELEASE, timeout=900)
    return Path(r.stdout.strip().splitlines()[-1])


def _deps_key() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    deps = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    return hashlib.sha256(deps.encode()).hexdigest()[:12]


def wheelhouse(dest: Path) -> Path:
    """The daemon's wheel built from this tree, beside its dependencies' wheels (cached
    by the dependency list): installed offline inside a machine that has no network."""
    deps = CACHE / "wheels" / _deps_key()
    if not (deps / ".complete").exists():
        tmp = deps.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        sh("python3", "-m", "pip", "wheel", "-q", "-w", str(tmp), str(ROOT), timeout=600)
        for w in tmp.glob("watchd-*.whl"):
            w.unlink()
        (tmp / ".complete").touch()
        shutil.rmtree(deps, ignore_errors=True)
        tmp.rename(deps)
    dest.mkdir(parents=True, exist_ok=True)
    for w in deps.glob("*.whl"):
        shutil.copy2(w, dest)
    sh(
        "python3", "-m", "pip", "wheel", "-q", "--no-deps",
        "-w", str(dest), str(ROOT), timeout=300,
    )  # fmt: skip
    return dest


class Machine:
    """A booted systemd-nspawn container on an overlay of the cached rootfs."""

    def __init__(self, lower: Path, name: str) -> None:
        self.lower = lower
        self.name = name
        self.dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir="/var/tmp"))
        self.root = self.dir / "merged"
        self.proc: subprocess.Popen[bytes] | None = None
        self.leader = 0
        self.log = self.dir / "console.log"
        self.boot_seconds = 0.0

    def mount(self) -> None:
        for d in ("upper", "work", "merged"):
            (self.dir / d).mkdir()
        sh(
            "mount", "-t", "overlay", "overlay", "-o",
            f"lowerdir={self.lower},upperdir={self.dir / 'upper'},workdir={self.dir / 'work'}",
            str(self.root),
        )  # fmt: skip

    def cannot_run(self) -> str | None:
        """Why this machine cannot run an nspawn container at all (no boot), or None.

        A container that starts but fails to boot is the test's failure, not a skip."""
        r = sh(
            "systemd-nspawn", "-q", "-D", str(self.root), "--keep-unit", "--register=no",
            "--private-network", "/bin/true",
            timeout=60, check=False,
        )  # fmt: skip
        if r.returncode == 0:
            return None
        lines = (r.stderr or r.stdout).strip().splitlines()
        return f"systemd-nspawn cannot run a container here: {lines[-1] if lines else r.returncode}"

    def chroot(self, *argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Before boot: a command in the rootfs (the host's network, no systemd)."""
        return sh("chroot", str(self.root), *argv, timeout=timeout)

    def boot(self, timeout: float = 90.0) -> None:
        t0 = time.monotonic()
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    "systemd-nspawn", "-D", str(self.root), "-b", "-M", self.name,
                    "--keep-unit", "--register=no", "--private-network",
                    "--console=read-only",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        deadline = t0 + timeout
        while not self.leader:
            self._find_leader()
            self._alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"no container init within {timeout}s: {self.console()}")
            time.sleep(0.1)
        while True:
            self._alive()
            r = self.run("systemctl", "is-system-running", check=False, timeout=10)
            state = r.stdout.strip()
            if state in ("running", "degraded"):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"boot not finished within {timeout}s ({state})")
            time.sleep(0.2)
        self.boot_seconds = time.monotonic() - t0

    def _alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"systemd-nspawn exited {self.proc.returncode}: {self.console()}")

    def _find_leader(self) -> None:
        """The container's PID 1: the process of this nspawn whose comm is systemd."""
        assert self.proc is not None
        todo = [self.proc.pid]
        while todo:
            pid = todo.pop()
            with contextlib.suppress(OSError):
                for tid in os.listdir(f"/proc/{pid}/task"):
                    kids = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
                    for k in kids:
                        if Path(f"/proc/{k}/comm").read_text().strip() == "systemd":
                            self.leader = int(k)
                            return
                        todo.append(int(k))

    def run(
        self, *argv: str, timeout: float = 30.0, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A command inside the booted machine (all its namespaces)."""
        assert self.leader
        return sh(
            "nsenter", "-t", str(self.leader), "-a", "--", *argv,
            timeout=timeout, check=check, input=input,
        )  # fmt: skip

    def console(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # SIGTERM: nspawn asks the container's systemd for a clean poweroff.
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            sh("umount", "-l", str(self.root), timeout=30, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
