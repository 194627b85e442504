"""Which settings a reload changed, which of them need a restart (judged against what
runs), and the reload's outcome on /metrics."""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from structlog.testing import capture_logs

from watchd.config.loading import load_config, parse_config
from watchd.config.model import Config
from watchd.config.secrets import resolve_secrets
from watchd.daemon import reloading
from watchd.daemon.app import Daemon
from watchd.daemon.reloading import Proposal, changed, needs_restart
from watchd.kits.redaction import REGISTRY


def cfg(**extra: object) -> Config:
    return parse_config(
        {
            "identities": [{"name": "a", "url": "https://coder.example.com", "token_env": "T"}],
            **extra,
        }
    )


def test_changed_names_each_leaf_setting() -> None:
    """Nested settings are named by dotted path; lists compare whole."""
    old = cfg()
    new = cfg(
        sweep={"enabled": True},
        detection={"confirm_rate": 2},
        server={"listen": "127.0.0.1:1"},
        telemetry={"protocol": "http/protobuf"},
        receivers=[{"name": "console", "console": {}}, {"name": "x", "console": {}}],
    )
    paths = changed(old, new)
    assert paths == [
        "detection.confirm_rate",
        "receivers",
        "server.listen",
        "telemetry.protocol",
        "sweep.enabled",
    ]
    assert needs_restart(paths) == ["server.listen", "telemetry.protocol"]


def test_same_config_changes_nothing() -> None:
    """Two loads of the same settings differ in nothing."""
    assert changed(cfg(), cfg()) == []


@pytest.fixture
def start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], Daemon]]:
    """Makes a daemon (not running) from a config file it reloads from; made in the test,
    so its clock runs on the test's loop (virtual under looptime)."""
    monkeypatch.setenv("T", "token-value-0123456789")
    made: list[Daemon] = []

    def make() -> Daemon:
        path = tmp_path / "watchd.yaml"
        write(path, listen="127.0.0.1:9310")
        config = load_config(path)
        made.append(Daemon(config, resolve_secrets(config), config_path=str(path)))
        return made[-1]

    yield make
    for d in made:
        d.db.close()


def write(path: Path, *, listen: str, server_url: str = "", **extra: object) -> None:
    """The config file: identity ``a`` and the given settings."""
    ident = {"name": "a", "url": "https://coder.example.com", "token_env": "T"}
    config = {
        "identities": [ident],
        "server": {"listen": listen, "external_url": server_url},
        "state_dir": str(path.parent / "state"),
        "telemetry": {"exporter": "none"},
    }
    path.write_text(yaml.safe_dump({**config, **extra}))


async def test_needs_restart_is_judged_against_what_runs(start: Callable[[], Daemon]) -> None:
    """A changed listen address needs a restart on every reload until it is reverted to
    the bound one, which then needs nothing (and the running config keeps the bound one)."""
    daemon = start()
    path = Path(str(daemon.config_path))
    url = "https://watchd.example.com"
    write(path, listen="127.0.0.1:9999", server_url=url)
    first = await daemon.reload()
    assert first.ok and first.body["needs_restart"] == ["server.listen"]
    assert first.body["applied"] == ["server.external_url"]
    assert daemon.config.server.listen == "127.0.0.1:9310"
    assert daemon.config.server.external_url == url
    again = await daemon.reload()  # a second HUP: still pending, still said
    assert again.body["needs_restart"] == ["server.listen"] and again.body["applied"] == []
    write(path, listen="127.0.0.1:9310", server_url=url)
    reverted = await daemon.reload()
    assert reverted.body["needs_restart"] == [] and reverted.body["applied"] == []
    snap = daemon.snapshot()
    assert snap.last_reload is not None and snap.last_reload["needs_restart"] == []


def _gauge(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, name
    return float(found.group(1))


@pytest.mark.looptime
async def test_the_last_reloads_outcome_is_exported_as_prometheus_names_it(
    start: Callable[[], Daemon],
) -> None:
    """watchd_config_last_reload_successful is 1 from the start-up load, 0 after an invalid
    file (the success timestamp unmoved), and 1 again after a good one, which moves it."""
    daemon = start()
    started = _gauge(daemon.metrics.render().decode(), SUCCESS_AT)
    assert _gauge(daemon.metrics.render().decode(), SUCCESSFUL) == 1.0
    assert started == pytest.approx(time.time(), abs=5)
    path = Path(str(daemon.config_path))
    write(path, listen="127.0.0.1:9310", identities=[{"name": "x", "url": "ftp://nope"}])
    await asyncio.sleep(60)
    bad = await daemon.reload()
    assert bad.status == 400 and any("identities.0.url" in p for p in bad.body["problems"])
    text = daemon.metrics.render().decode()
    assert _gauge(text, SUCCESSFUL) == 0.0 and _gauge(text, SUCCESS_AT) == started
    assert 'watchd_config_reloads_total{outcome="rejected"} 1.0' in text
    write(path, listen="127.0.0.1:9310")
    await asyncio.sleep(60)
    assert (await daemon.reload()).ok
    text = daemon.metrics.render().decode()
    assert _gauge(text, SUCCESSFUL) == 1.0
    assert _gauge(text, SUCCESS_AT) == pytest.approx(started + 120, abs=0.01)


SUCCESSFUL = "watchd_config_last_reload_successful"
SUCCESS_AT = "watchd_config_last_reload_success_timestamp_seconds"


class Notes:
    """The service manager's side of sd_notify: what a reload told it."""

    def __init__(self) -> None:
        self.said: list[dict[str, str]] = []

    def reloading(self) -> bool:
        self.said.append({"RELOADING": "1"})
        return True

    def notify(self, **fields: str) -> bool:
        self.said.append(fields)
        return True


async def test_a_reload_that_fails_part_way_answers_500_and_is_not_successful(
    start: Callable[[], Daemon],
) -> None:
    """Applying that raises is a 500 naming the error (a secret in it scrubbed), counted as
    failed, the success gauge's input false, and the service manager told; the next
    reload runs."""
    daemon = start()
    secret = "tok-" + "s" * 24
    REGISTRY.add(secret)

    async def broken(proposal: Proposal) -> dict[str, list[str]]:
        raise RuntimeError(f"receiver refused its settings ({secret})")

    notes = Notes()
    propose = functools.partial(
        reloading.propose, daemon.config_path, daemon.config, fixed=frozenset()
    )
    with capture_logs() as logged:
        out = await daemon.reloads.run(propose, broken, notifier=notes, status_line=str)
    assert out.status == 500 and out.body["status"] == "failed"
    assert "RuntimeError: receiver refused" in out.body["error"] and secret not in str(out.body)
    assert daemon.reloads.counts["failed"] == 1 and not daemon.reloads.successful
    assert [e["event"] for e in logged] == ["reload.failed"] and secret not in str(logged)
    assert notes.said[0] == {"RELOADING": "1"} and notes.said[-1]["STATUS"].startswith(
        "reload failed: RuntimeError"
    )
    assert (await daemon.reload()).ok and daemon.reloads.successful
