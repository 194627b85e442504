"""Processes under measurement: the simulator, the daemon, a bare consumer; /proc readings."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

TICKS = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parents[1]


def shipped_python() -> str:
    """A Python with watchd's runtime dependencies only, as ``pip install watchd`` gives
    (no dev extras: e.g. import-linter's ``rich``, which structlog would import), built
    once per dependency list in the temp folder and reused. The daemon under it imports
    this working tree (``python -m watchd`` from the repository root)."""
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    key = hashlib.sha256("\n".join([sys.version, *deps]).encode()).hexdigest()[:12]
    venv = Path(tempfile.gettempdir()) / f"watchd-bench-shipped-{key}"
    python = venv / "bin" / "python"
    if not (venv / ".complete").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *deps],
            check=True,
        )
        (venv / ".complete").write_text("\n".join(deps))
    return str(python)


def compiled_env() -> dict[str, str]:
    """The environment of an installed watchd: byte-code compiled once and reused (pip
    and the Dockerfile compile it at install time; PYTHONDONTWRITEBYTECODE, set on this
    machine, would make every start compile the sources again). The cache lives in the
    temp folder, never in the working tree."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "watchd-bench-pycache")
    return env


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(
    method: str, url: str, body: Any = None, timeout: float = 600, ca_file: str | None = None
) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    trust = ssl.create_default_context(cafile=ca_file) if ca_file else None
    with urllib.request.urlopen(req, timeout=timeout, context=trust) as r:
        return json.loads(r.read() or b"null")


def wait_for(cond: Any, *, within: float, step: float = 0.05) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < within:
        try:
            if cond():
                return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(step)
    raise TimeoutError(f"not within {within}s")


class Sim:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "watchd", "sim", "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        info = json.loads(self.proc.stdout.readline())
        self.url: str = info["url"]
        self.identities: list[dict[str, str]] = info["identities"]
        # With --tls: the CA a client trusts (an identity's ca_file).
        self.ca_file: str | None = info.get("ca_file")

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        return http(method, self.url + "/__sim" + path, body, ca_file=self.ca_file)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        if self.proc.stdout:
            self.proc.stdout.close()


def _profile(pid: int) -> subprocess.Popen[bytes] | None:
    """With BENCH_PROFILE=DIR, sample the daemon with py-spy into DIR (collapsed stacks)."""
    out = os.environ.get("BENCH_PROFILE")
    if not out:
        return None
    Path(out).mkdir(parents=True, exist_ok=True)
    dest = Path(out) / f"daemon-{pid}.txt"
    spy = Path(sys.executable).with_name("py-spy")
    return subprocess.Popen(
        [
            str(spy),
            "record",
            "--pid",
            str(pid),
            "--rate",
            "250",
            "--format",
            "raw",
            "--output",
            str(dest),
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class Daemon:
    def __init__(
        self,
        sim: Sim,
        *,
        extra: dict[str, Any] | None = None,
        identity_extra: dict[str, Any] | None = None,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
    ) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="watchd-bench-"))
        self.listen = f"127.0.0.1:{free_port()}"
        idents = []
        for i in sim.identities:
            token = self.tmp / i["name"]
            token.write_text(i["token"])
            token.chmod(0o600)
            idents.append(
                {
                    "name": i["name"],
                    "url": sim.url,
                    "token_file": str(token),
                    "requests_per_minute": 6000,
                    **({"ca_file": sim.ca_file} if sim.ca_file else {}),
                    **(identity_extra or {}),
                }
            )
        config: dict[str, Any] = {
            "identities": idents,
            "server": {"listen": self.listen},
            "state_dir": str(self.tmp / "state"),
            "quota": {"enabled": False},
            "telemetry": {"own_events": False},
            "reconcile_interval": "10m",
            "budgets": {"running": "1h", "default": "1h"},
        }
        config.update(extra or {})
        (self.tmp / "watchd.yaml").write_text(yaml.safe_dump(config))
        self.started = time.monotonic()
        # BENCH_DAEMON_LOG=FILE: the daemon's info-level log, for a timeline of a case.
        log_to = os.environ.get("BENCH_DAEMON_LOG")
        self.proc = subprocess.Popen(
            [
                python,
                "-m",
                "watchd",
                "--log-level",
                "info" if log_to else "warning",
                "run",
                "-c",
                str(self.tmp / "watchd.yaml"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(log_to, "ab") if log_to else subprocess.DEVNULL,  # noqa: SIM115
            cwd=ROOT,
            env=env,
        )
        self.profiler = _profile(self.proc.pid)

    def get(self, path: str) -> Any:
        return http("GET", f"http://{self.listen}{path}", timeout=60)

    def ready(self) -> bool:
        try:
            return bool(self.get("/readyz")["ready"])
        except OSError:
            return False

    def events(self) -> int:
        return sum(int(i["events"]) for i in self.get("/status?format=json")["identities"])

    @property
    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    @property
    def rss(self) -> float:
        return rss_mb(self.proc.pid)

    def stop(self) -> None:
        if self.profiler is not None:
            self.profiler.send_signal(signal.SIGINT)
            self.profiler.wait(60)
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)


def serve_hook(hook: Any) -> tuple[int, Any]:
    """A webhook receiver for the daemon on a thread and loop of its own: ``POST /hook``
    answered by the coroutine ``hook(request)``. Returns its port and a function that
    stops it."""
    import asyncio
    import threading

    from aiohttp import web

    loop = asyncio.new_event_loop()
    app = web.Application(client_max_size=256 << 20)
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    port = free_port()
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)

    return port, stop
