"""`watchd check-config`: exit codes, one problem per line by path, the route tree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def run(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "watchd", "check-config", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_valid_config_prints_the_resolved_route_tree(tmp_path: Path) -> None:
    """A valid config exits 0 and prints each route with inherited timings."""
    token = tmp_path / "token"
    token.write_text("secret-token-value-123")
    token.chmod(0o600)
    cfg = tmp_path / "watchd.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "identities": [
                    {"name": "team-a", "url": "https://coder.example.com", "token_file": str(token)}
                ],
                "receivers": [
                    {"name": "console", "console": {}},
                    {"name": "hook", "webhook": {"url": "http://127.0.0.1:9/x"}},
                ],
                "route": {
                    "receiver": "console",
                    "group_wait": "10s",
                    "routes": [{"matchers": ['severity="critical"'], "receiver": "hook"}],
                },
            }
        )
    )
    r = run(cfg)
    assert r.returncode == 0, r.stderr
    assert 'severity="critical" -> hook' in r.stdout and "10s/5m/4h" in r.stdout
    assert "secret-token-value-123" not in r.stdout + r.stderr


def test_example_config_reports_each_missing_secret_by_path() -> None:
    """The shipped example (its secret files absent here) exits 2, one line per reference."""
    r = run(ROOT / "config" / "watchd.example.yaml")
    assert r.returncode == 2
    problems = [line for line in r.stderr.splitlines() if line.startswith("  ")]
    assert any("/run/secrets/pd" in p for p in problems)
    assert any("/run/secrets/slack" in p for p in problems)
    assert any("team-b" in p and "CREDENTIALS_DIRECTORY" in p for p in problems)


def _sharded(tmp_path: Path, **sharding: object) -> Path:
    token = tmp_path / "token"
    token.write_text("secret-token-value-123")
    token.chmod(0o600)
    cfg = tmp_path / "watchd.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "identities": [
                    {
                        "name": f"id-{i}",
                        "url": "https://coder.example.com",
                        "token_file": str(token),
                    }
                    for i in range(9)
                ],
                "sharding": sharding,
                "receivers": [{"name": "hook", "webhook": {"url": "http://127.0.0.1:9/x"}}],
                "route": {"receiver": "hook"},
                "state_dir": str(tmp_path / "state"),
            }
        )
    )
    return cfg


def test_check_config_prints_the_shard_assignment_for_n_replicas(tmp_path: Path) -> None:
    """--replicas N prints which replica owns each identity and what moves from the
    configured count; the token never appears."""
    from watchd.kits.sharding import assignment, owned_by

    cfg = _sharded(tmp_path, replicas=3, index=0)
    r = subprocess.run(
        [sys.executable, "-m", "watchd", "check-config", "-c", str(cfg), "--replicas", "4"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    table = assignment([f"id-{i}" for i in range(9)], replicas=4)
    for rep in range(4):
        names = ", ".join(owned_by(table, rep)) or "(none)"
        assert f"  replica {rep}: {names}" in r.stdout
    assert "from 3 to 4 replicas moves" in r.stdout
    assert "secret-token-value-123" not in r.stdout + r.stderr


def test_check_config_explains_why_ha_refuses_a_webhook(tmp_path: Path) -> None:
    """Replication factor 2 with a webhook receiver exits 2 naming the receiver, why it
    would double-page, and the two ways out."""
    r = run(_sharded(tmp_path, replicas=2, replication_factor=2))
    assert r.returncode == 2
    assert "receivers.0.webhook: receiver 'hook' would page once per replica" in r.stderr
    assert "Alertmanager cluster" in r.stderr and "ha_direct_receivers: allow" in r.stderr
    assert "Traceback" not in r.stderr


def test_run_without_a_readable_pod_ordinal_exits_2_naming_the_field(tmp_path: Path) -> None:
    """index_from: pod_name with a POD_NAME that has no ordinal: `run` exits 2 with one line
    naming sharding.index_from (no traceback), and check-config says run would fail."""
    import os

    cfg = _sharded(tmp_path, replicas=3, index_from="pod_name")
    env = {**os.environ, "POD_NAME": "billing-agent-7d9f-abcde"}
    r = subprocess.run(
        [sys.executable, "-m", "watchd", "run", "-c", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert r.returncode == 2
    assert "watchd: cannot start: sharding.index_from: POD_NAME 'billing-agent-7d9f-abcde'" in (
        r.stderr
    )
    assert "Traceback" not in r.stderr
    check = subprocess.run(
        [sys.executable, "-m", "watchd", "check-config", "-c", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert check.returncode == 2 and "`watchd run` would fail:" in check.stderr
    assert "does not end in a pod ordinal" in check.stderr


def test_offline_checks_the_file_only_so_it_passes_on_a_live_host(tmp_path: Path) -> None:
    """On a host where the daemon runs (its listen address taken) and outside its unit (a
    *_credential unavailable), check-config fails, but --offline checks the file and its
    semantics only and passes; a semantic mistake still fails it."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = tmp_path / "watchd.yaml"
        config = {
            "identities": [
                {"name": "a", "url": "https://coder.example.com", "token_credential": "team-a"}
            ],
            "server": {"listen": f"127.0.0.1:{port}"},
            "state_dir": str(tmp_path / "state"),
        }
        cfg.write_text(yaml.safe_dump(config))
        live = run(cfg)
        assert live.returncode == 2 and "in use" in live.stdout + live.stderr
        offline = subprocess.run(
            [sys.executable, "-m", "watchd", "check-config", "-c", str(cfg), "--offline"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert offline.returncode == 0, offline.stdout + offline.stderr
        assert "offline" in offline.stdout
        config["route"] = {"receiver": "nobody"}
        cfg.write_text(yaml.safe_dump(config))
        bad = subprocess.run(
            [sys.executable, "-m", "watchd", "check-config", "-c", str(cfg), "--offline"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert bad.returncode == 2 and "nobody" in bad.stdout + bad.stderr


def test_an_uncreatable_state_dir_is_found_by_trying(tmp_path: Path) -> None:
    """A state_dir under /proc cannot be created even by root (os.access says it can):
    the check tries, reports it, and leaves nothing behind where it could create."""
    from watchd.daemon.preflight import check_state_dir

    problem = check_state_dir(Path("/proc/watchd-check/state"))
    assert problem is not None and problem.startswith("state_dir: cannot create /proc/")
    assert check_state_dir(tmp_path / "x" / "y") is None and not (tmp_path / "x").exists()
