"""Which settings a reload changed, and which of them need a restart."""

from __future__ import annotations

from watchd.config.loading import parse_config
from watchd.config.model import Config
from watchd.daemon.reloading import changed, needs_restart


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
