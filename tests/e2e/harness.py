"""Real processes for end-to-end tests: ``watchd sim`` and ``watchd run``.

Both are started as the user would start them (``python -m watchd …``),
talk over loopback only, and are always stopped by the fixture.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def eventually(cond: Callable[[], Any], *, within: float = 20.0, step: float = 0.2) -> Any:
    """Poll an async or sync condition until it is truthy; return its value."""
    end = time.monotonic() + within
    last: Any = None
    while time.monotonic() < end:
        last = cond()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(step)
    raise AssertionError(f"condition not met within {within}s (last: {last!r})")


class SimProcess:
    def __init__(
        self,
        *,
        era: str = "E",
        scenario: str = "empty",
        clock_offset: float = 0.0,
        ping_interval: float = 15.0,
        tls: bool = False,
    ) -> None:
        """``tls``: the simulator serves HTTPS; ``ca_file`` is then the CA to trust."""
        sizing: list[str] = ["--tls"] if tls else []
        if scenario.startswith("bulk_"):  # bulk_N: N users without chats
            scenario, users = "bulk", scenario.split("_", 1)[1]
            sizing = ["--users", users, "--chats-per-user", "0"]
        self.args = [
            sys.executable,
            "-m",
            "watchd",
            "sim",
            "--listen",
            "127.0.0.1:0",
            "--era",
            era,
            "--scenario",
            scenario,
            "--clock-offset",
            str(clock_offset),
            "--ping-interval",
            str(ping_interval),
            *sizing,
        ]
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.ca_file: str | None = None
        self.identities: list[dict[str, str]] = []

    def start(self) -> SimProcess:
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        info = json.loads(line)
        self.url = info["url"]
        self.identities = info["identities"]
        self.ca_file = info.get("ca_file")
        return self

    def token(self, username: str) -> str:
        return next(i["token"] for i in self.identities if i["username"] == username)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()

    async def admin(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        trust = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else True
        async with (
            aiohttp.ClientSession() as s,
            s.request(method, self.url + "/__sim" + path, json=body, ssl=trust) as r,
        ):
            data = await r.json()
            assert r.status == 200, data
            return data

    async def add_chat(self, owner: str, **body: Any) -> str:
        return str((await self.admin("POST", "/chats", {"owner": owner, **body}))["id"])

    async def set_status(self, chat_id: str, status: str, *, silent: bool = False) -> None:
        await self.admin("POST", f"/chats/{chat_id}/status", {"status": status, "silent": silent})


class DaemonProcess:
    def __init__(
        self,
        tmp: Path,
        sim: SimProcess,
        *,
        identities: list[tuple[str, str]],
        extra: dict[str, Any] | None = None,
        state_dir: Path | None = None,
        env: dict[str, str] | None = None,
        identity_extra: dict[str, Any] | None = None,
        nofile: tuple[int, int] | None = None,
    ) -> None:
        """``nofile``: the (soft, hard) RLIMIT_NOFILE the daemon starts with."""
        self.tmp = tmp
        self.nofile = nofile
        self.sim = sim
        self.env = env or {}
        self.port = free_port()
        self.listen = f"127.0.0.1:{self.port}"
        secrets = tmp / "secrets"
        secrets.mkdir(exist_ok=True)
        idents = []
        for name, username in identities:
            token_file = secrets / name
            token_file.write_text(sim.token(username) + "\n")
            token_file.chmod(0o600)
            idents.append(
                {
                    "name": name,
                    "url": sim.url,
                    "token_file": str(token_file),
                    "unhealthy_after": "2s",
                    "labels": {"team": name},
                    **(identity_extra or {}),
                }
            )
        config: dict[str, Any] = {
            "identities": idents,
            "budgets": {
                "running": "3s",
                "requires_action": "3s",
                "interrupting": "3s",
                "pending": "3s",
                "default": "3s",
            },
            "reconcile_interval": "5s",  # the configured floor
            "server": {"listen": self.listen},
            "state_dir": str(state_dir or tmp / "state"),
        }
        for key, value in (extra or {}).items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}  # e.g. server: keep listen
            else:
                config[key] = value
        self.config_path = tmp / "watchd.yaml"
        self.config = config
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None
        self.stdout_path = tmp / f"stdout-{self.port}.log"
        self.stderr_path = tmp / f"stderr-{self.port}.log"

    def start(self) -> DaemonProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with self.stdout_path.open("ab") as out, self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen(
                [
                    *self._with_limits(),
                    sys.executable,
                    "-m",
                    "watchd",
                    "--log-format",
                    "json",
                    "run",
                    "-c",
                    str(self.config_path),
                ],
                stdout=out,
                stderr=err,
                env=env,
            )
        return self

    def _with_limits(self) -> list[str]:
        """A prefix that sets the asked-for RLIMIT_NOFILE, then execs the daemon."""
        if self.nofile is None:
            return []
        soft, hard = self.nofile
        code = (
            "import os, resource, sys; "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard})); "
            "os.execv(sys.argv[1], sys.argv[1:])"
        )
        return [sys.executable, "-c", code]

    async def get(self, path: str) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://{self.listen}{path}", timeout=aiohttp.ClientTimeout(total=5)) as r,
        ):
            text = await r.text()
            try:
                return r.status, json.loads(text)
            except ValueError:
                return r.status, text

    async def _answers(self, path: str) -> bool:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            status, _ = await self.get(path)
            return status == 200
        assert self.proc is not None and self.proc.poll() is None, self.logs()
        return False

    async def wait_up(self, within: float = 20.0) -> None:
        """Until the server answers /healthz (identities may still be unseeded)."""
        await eventually(lambda: self._answers("/healthz"), within=within)

    async def wait_ready(self, within: float = 20.0) -> None:
        """Until /readyz: every identity's first seed attempt made (seeded, or refused)."""
        await eventually(lambda: self._answers("/readyz"), within=within)

    async def status(self) -> dict[str, Any]:
        _, doc = await self.get("/status")
        assert isinstance(doc, dict)
        return doc

    async def firing(self, alertname: str | None = None) -> list[dict[str, Any]]:
        alerts = (await self.status())["alerts"]["firing"]
        return [a for a in alerts if alertname is None or a["labels"]["alertname"] == alertname]

    async def resolved(self, alertname: str | None = None) -> list[dict[str, Any]]:
        alerts = (await self.status())["alerts"]["recent"]
        return [
            a
            for a in alerts
            if a["status"] == "resolved"
            and (alertname is None or a["labels"]["alertname"] == alertname)
        ]

    def logs(self) -> str:
        out = self.stdout_path.read_text() if self.stdout_path.exists() else ""
        err = self.stderr_path.read_text() if self.stderr_path.exists() else ""
        return out + err

    def log_events(self) -> list[dict[str, Any]]:
        events = []
        for line in self.stderr_path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        return events

    def identity_entry(self, name: str, username: str) -> dict[str, Any]:
        """A config entry for another identity (its token file written)."""
        token_file = self.tmp / "secrets" / name
        token_file.write_text(self.sim.token(username) + "\n")
        token_file.chmod(0o600)
        return {
            "name": name,
            "url": self.sim.url,
            "token_file": str(token_file),
            "unhealthy_after": "2s",
            "labels": {"team": name},
        }

    def rewrite(self, config: dict[str, Any]) -> None:
        self.config = config
        self.config_path.write_text(yaml.safe_dump(config))

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def terminate(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
