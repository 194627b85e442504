"""README's command table, row by row, with the real ``watchd`` process: exit codes, and
commands that work where operators are (only the secrets they use, options anywhere)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.harness import DaemonProcess, SimProcess, free_port

StartSim = Callable[..., SimProcess]
StartDaemon = Callable[..., DaemonProcess]
ROOT = Path(__file__).resolve().parents[2]


def watchd(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> Any:
    import os

    return subprocess.run(
        [sys.executable, "-m", "watchd", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


def no_traceback(r: Any) -> None:
    assert "Traceback" not in r.stdout + r.stderr, r.stderr


def credential_config(tmp: Path, **extra: Any) -> Path:
    """A config as the systemd guide writes it: every secret a credential (unavailable here)."""
    cfg = {
        "identities": [
            {"name": "team-a", "url": "http://127.0.0.1:9", "token_credential": "team-a"}
        ],
        "receivers": [
            {"name": "console", "console": {}},
            {"name": "pager", "pagerduty": {"routing_key_credential": "pd"}},
            {"name": "chat", "slack": {"webhook_url_credential": "slack"}},
        ],
        "route": {
            "receiver": "console",
            "routes": [{"matchers": ['severity="critical"'], "receiver": "pager"}],
        },
        "state_dir": str(tmp / "state"),
        "server": {"listen": f"127.0.0.1:{free_port()}"},
        **extra,
    }
    path = tmp / "credentials.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port some other program is listening on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield int(s.getsockname()[1])
    s.close()


# -- watchd run ---------------------------------------------------------------------------


async def test_run_exits_0_on_sigterm_and_2_on_invalid_config(
    start_sim: StartSim, start_daemon: StartDaemon, tmp_path: Path
) -> None:
    """`run`: 0 after SIGTERM; 2 with each problem on a line for an invalid config."""
    sim = start_sim()
    d = start_daemon(sim)
    await d.wait_up()
    assert d.terminate() == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("identities: []\nreconcile_interval: 0\n")
    r = watchd("run", "-c", str(bad))
    assert r.returncode == 2
    assert "reconcile_interval: 0s is below the minimum of 5s" in r.stderr
    no_traceback(r)


async def test_run_with_unusable_state_dir_is_one_line_exit_2(
    start_sim: StartSim, start_daemon: StartDaemon, tmp_path: Path
) -> None:
    """A state_dir that cannot be created is one line naming it, exit 2, no traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    sim = start_sim()
    d = DaemonProcess(tmp_path, sim, identities=[("team-a", "alice")], state_dir=blocker / "state")
    r = watchd("run", "-c", str(d.config_path))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"watchd: cannot start: state_dir: cannot create {blocker / 'state'} "
        f"({blocker} is not a directory)"
    ]
    check = watchd("check-config", "-c", str(d.config_path))
    assert check.returncode == 2 and "state_dir: cannot create" in check.stderr


async def test_run_with_listen_address_in_use_is_one_line_exit_2(
    start_sim: StartSim, tmp_path: Path, busy_port: int
) -> None:
    """A listen address already in use is one line naming server.listen, exit 2."""
    sim = start_sim()
    d = DaemonProcess(
        tmp_path, sim, identities=[("team-a", "alice")], extra={"server": {"listen": ""}}
    )
    d.config["server"]["listen"] = f"127.0.0.1:{busy_port}"
    d.rewrite(d.config)
    r = watchd("run", "-c", str(d.config_path))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"watchd: cannot start: server.listen: 127.0.0.1:{busy_port} is already in use "
        "(another watchd, or another program)"
    ]
    check = watchd("check-config", "-c", str(d.config_path))
    assert check.returncode == 2 and "already in use" in check.stderr
    assert "route tree:" in check.stdout


# -- watchd check-config ------------------------------------------------------------------


def test_check_config_lists_unavailable_secrets_and_still_prints_the_tree(
    tmp_path: Path,
) -> None:
    """Outside systemd: every credential listed, the route tree printed, exit 2."""
    r = watchd("check-config", "-c", str(credential_config(tmp_path)))
    assert r.returncode == 2
    assert 'severity="critical" -> pager' in r.stdout
    for ref in ("identities.0.token (team-a)", "(pager).routing_key", "(chat).webhook_url"):
        assert any(
            ref in line and "CREDENTIALS_DIRECTORY" in line for line in r.stderr.splitlines()
        )
    no_traceback(r)


def test_check_config_exit_codes(tmp_path: Path) -> None:
    """check-config: 0 valid, 2 invalid (a matcher typo names the matcher)."""
    token = tmp_path / "token"
    token.write_text("a-token-value-0123")
    token.chmod(0o600)
    good = {
        "identities": [{"name": "a", "url": "http://127.0.0.1:9", "token_file": str(token)}],
        "state_dir": str(tmp_path / "state"),
        "server": {"listen": "127.0.0.1:0"},
    }
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(good))
    assert watchd("check-config", "-c", str(path)).returncode == 0
    path.write_text(
        yaml.safe_dump({**good, "route": {"receiver": "console", "matchers": ["severity==x"]}})
    )
    r = watchd("check-config", "-c", str(path))
    assert r.returncode == 2
    assert "route.matchers: bad matcher 'severity==x'" in r.stderr


# -- watchd scan --------------------------------------------------------------------------


async def test_scan_exit_codes_one_failing_identity_does_not_hide_stuck(
    start_sim: StartSim, tmp_path: Path
) -> None:
    """scan: 0 none stuck, 1 some stuck even when another identity failed, 2 none scanned."""
    sim = start_sim()
    d = DaemonProcess(tmp_path, sim, identities=[("team-a", "alice")])
    cfg = d.config
    assert watchd("scan", "-c", str(d.config_path)).returncode == 0
    await sim.add_chat("alice", status="running", age=60)
    broken = {**cfg["identities"][0], "name": "broken", "url": "http://127.0.0.1:9"}
    cfg["identities"] = [cfg["identities"][0], broken]
    d.rewrite(cfg)
    r = watchd("scan", "-c", str(d.config_path))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "broken (http://127.0.0.1:9): COULD NOT SCAN" in r.stdout
    cfg["identities"] = [broken]
    d.rewrite(cfg)
    assert watchd("scan", "-c", str(d.config_path)).returncode == 2


def test_scan_needs_no_receiver_secret(tmp_path: Path) -> None:
    """scan reads identity tokens only: an unavailable receiver secret is not its problem."""
    token = tmp_path / "token"
    token.write_text("a-token-value-0123")
    token.chmod(0o600)
    path = credential_config(tmp_path)
    cfg = yaml.safe_load(path.read_text())
    cfg["identities"][0] = {"name": "team-a", "url": "http://127.0.0.1:9", "token_file": str(token)}
    path.write_text(yaml.safe_dump(cfg))
    r = watchd("scan", "-c", str(path), "--json")
    assert r.returncode == 2  # the deployment is unreachable, not a config problem
    assert "CREDENTIALS_DIRECTORY" not in r.stdout + r.stderr
    assert "COULD NOT SCAN" not in r.stderr
    no_traceback(r)


# -- watchd demo / sim --------------------------------------------------------------------


def test_demo_exits_0_and_2_when_its_port_is_busy(busy_port: int) -> None:
    """demo: 0 after its duration; 2 with one line when the listen port is taken."""
    r = watchd("demo", "--duration", "2", "--listen", f"127.0.0.1:{free_port()}")
    assert r.returncode == 0, r.stderr
    busy = watchd("demo", "--duration", "2", "--listen", f"127.0.0.1:{busy_port}")
    assert busy.returncode == 2
    assert busy.stderr.strip().splitlines() == [
        f"watchd demo: cannot start: --listen: 127.0.0.1:{busy_port} is already in use "
        "(another watchd, or another program); pick another with --listen"
    ]


def test_sim_exits_0_on_sigterm() -> None:
    """sim: prints its URL and tokens, exits 0 on SIGTERM."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "watchd", "sim", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    assert '"url"' in proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    proc.stdout.close()


# -- watchd test-alert --------------------------------------------------------------------


def test_test_alert_exit_codes_and_only_its_receivers_secret(tmp_path: Path) -> None:
    """test-alert: 0 delivered with every other secret unavailable; 1 for a failure, an
    unknown receiver or its own secret unavailable."""
    path = credential_config(tmp_path)
    cfg = yaml.safe_load(path.read_text())
    cfg["receivers"].append({"name": "dead", "webhook": {"url": "http://127.0.0.1:9/x"}})
    path.write_text(yaml.safe_dump(cfg))
    ok = watchd("test-alert", "console", "-c", str(path))
    assert ok.returncode == 0, ok.stderr
    assert "CREDENTIALS_DIRECTORY" not in ok.stdout + ok.stderr
    failed = watchd("test-alert", "dead", "-c", str(path))
    assert failed.returncode == 1
    unknown = watchd("test-alert", "nope", "-c", str(path))
    assert unknown.returncode == 1 and "no receiver named 'nope'" in unknown.stderr
    secret = watchd("test-alert", "pager", "-c", str(path))
    assert secret.returncode == 1
    assert "(pager).routing_key" in secret.stderr and "team-a" not in secret.stderr
    for r in (ok, failed, unknown, secret):
        no_traceback(r)


# -- watchd silence -----------------------------------------------------------------------


async def test_silence_by_url_and_token_file_needs_no_other_secret(
    start_sim: StartSim, start_daemon: StartDaemon, tmp_path: Path
) -> None:
    """silence: --url/--token-file or env work with a config whose other secrets are all
    unavailable; options after the action; failures exit 1."""
    admin = tmp_path / "admin"
    admin.write_text("admin-token-0123456789")
    admin.chmod(0o600)
    sim = start_sim()
    d = start_daemon(sim, extra={"server": {"admin_token_file": str(admin)}})
    await d.wait_up()
    url = f"http://{d.listen}"
    add = watchd("silence", "add", 'identity="team-a"', "--url", url, "--token-file", str(admin))
    assert add.returncode == 0, add.stderr
    # The default URL comes from server.listen; the token from the environment.
    creds = credential_config(tmp_path, server={"listen": d.listen})
    listed = watchd(
        "silence", "list", "-c", str(creds), "--log-level", "debug",
        env={"WATCHD_ADMIN_TOKEN": "admin-token-0123456789"},
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert 'identity="team-a"' in listed.stdout
    typo = watchd("silence", "add", "severity==critical", "--url", url, "--token-file", str(admin))
    assert typo.returncode == 1
    assert "bad matcher 'severity==critical'" in typo.stderr
    denied = watchd("silence", "add", 'a="b"', "--url", url)
    assert denied.returncode == 1 and "HTTP 401" in denied.stderr
    down = watchd("silence", "list", "--url", f"http://127.0.0.1:{free_port()}")
    assert down.returncode == 1 and "cannot reach the daemon" in down.stderr
    for r in (add, listed, typo, denied, down):
        no_traceback(r)
        assert "admin-token-0123456789" not in r.stdout + r.stderr


async def test_silence_api_rejects_a_double_equals_matcher(
    start_sim: StartSim, start_daemon: StartDaemon, tmp_path: Path
) -> None:
    """The runtime API refuses `severity==critical` with a 400 naming the matcher."""
    import aiohttp

    admin = tmp_path / "admin"
    admin.write_text("admin-token-0123456789")
    admin.chmod(0o600)
    sim = start_sim()
    d = start_daemon(sim, extra={"server": {"admin_token_file": str(admin)}})
    await d.wait_up()
    async with (
        aiohttp.ClientSession(headers={"Authorization": "Bearer admin-token-0123456789"}) as s,
        s.post(
            f"http://{d.listen}/api/v1/silences",
            json={"matchers": ["severity==critical"], "duration": "1h"},
        ) as r,
    ):
        assert r.status == 400
        assert "severity==critical" in (await r.json())["error"]


# -- global options -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["-c", "{cfg}", "--log-level", "debug", "--json", "check-config"],
        ["check-config", "-c", "{cfg}", "--log-level", "debug", "--json"],
        ["--log-level", "error", "check-config", "--json", "-c", "{cfg}"],
    ],
)
def test_global_options_before_or_after_the_command(argv: list[str], tmp_path: Path) -> None:
    """-c, --log-level and --json are accepted before or after the sub-command."""
    import json

    path = credential_config(tmp_path)
    r = watchd(*(a.format(cfg=path) for a in argv))
    assert r.returncode == 2  # the credentials are unavailable here
    doc = json.loads(r.stdout)
    assert doc["path"] == str(path) and doc["route_tree"]
