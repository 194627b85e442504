"""Configuration validation and secret references."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from watchd.config.fields import ConfigError, parse_duration
from watchd.config.loading import parse_config
from watchd.config.secrets import resolve_secrets
from watchd.kits.redaction import REGISTRY


def base(**extra: object) -> dict[str, object]:
    return {
        "identities": [
            {"name": "team-a", "url": "https://coder.example.com", "token_env": "WATCHD_TEST_TOKEN"}
        ],
        **extra,
    }


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("15m", 900), ("2h", 7200), ("1h30m", 5400), ("500ms", 0.5), (12, 12)],
)
def test_durations(text: str | int, seconds: float) -> None:
    """Durations accept Go-style units and bare seconds."""
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "3x", "m5", "5 m", "-3s", "1h-2m", True])
def test_bad_durations(text: object) -> None:
    """Malformed durations are rejected."""
    with pytest.raises(ValueError):
        parse_duration(text)


def test_defaults_follow_the_spec() -> None:
    """Budgets, route timings and the reconcile interval default as documented."""
    c = parse_config(base())
    b = c.budgets
    assert (b.pending, b.running, b.interrupting, b.requires_action, b.default) == (
        600,
        1800,
        120,
        900,
        1800,
    )
    assert b.for_status("hibernating") == 1800
    assert c.reconcile_interval == 60
    assert c.server.listen == "127.0.0.1:9310"


def test_every_problem_is_reported_with_its_path() -> None:
    """Unknown keys, bad URLs, bad durations and bad matchers each name their field path."""
    with pytest.raises(ConfigError) as err:
        parse_config(
            {
                "identities": [
                    {"name": "a", "url": "ftp://x", "token_env": "T", "tokne_file": "x"}
                ],
                "budgets": {"running": "soon"},
                "route": {"receiver": "console", "matchers": ['severity=~"("']},
                "surprise": 1,
            }
        )
    problems = "\n".join(err.value.problems)
    for expected in [
        "identities.0.url:",
        "identities.0.tokne_file: unknown key",
        "budgets.running:",
        "route.matchers:",
        "surprise: unknown key",
    ]:
        assert expected in problems


def test_route_receivers_must_exist() -> None:
    """A route naming an undefined receiver is an error naming the route's path."""
    with pytest.raises(ConfigError, match=r"route.routes.0.receiver: no receiver named 'pager'"):
        parse_config(
            base(
                route={
                    "receiver": "console",
                    "routes": [{"matchers": ['severity="critical"'], "receiver": "pager"}],
                }
            )
        )


def test_exactly_one_token_reference() -> None:
    """An identity needs exactly one of token_file, token_env, token_credential."""
    with pytest.raises(ConfigError, match="exactly one of token_file"):
        parse_config(
            {"identities": [{"name": "a", "url": "http://x", "token_env": "A", "token_file": "/x"}]}
        )


def test_duplicate_identity_names_rejected() -> None:
    """Identity names are unique (they key state and alerts)."""
    ident = {"name": "a", "url": "http://x", "token_env": "A"}
    with pytest.raises(ConfigError, match="unique"):
        parse_config({"identities": [ident, ident]})


def test_url_credentials_rejected() -> None:
    """A URL with embedded credentials is refused (secrets go by reference)."""
    with pytest.raises(ConfigError, match="credentials in URLs"):
        parse_config({"identities": [{"name": "a", "url": "https://u:p@x", "token_env": "A"}]})


def test_secret_file_problems_named_not_shown(tmp_path: Path) -> None:
    """Missing, empty and world-readable secret files are reported by path, never content."""
    empty = tmp_path / "empty"
    empty.write_text("")
    empty.chmod(0o600)
    loose = tmp_path / "loose"
    loose.write_text("s3cr3t-value-loose")
    loose.chmod(0o644)
    c = parse_config(
        {
            "identities": [
                {"name": "a", "url": "http://x", "token_file": str(tmp_path / "missing")},
                {"name": "b", "url": "http://x", "token_file": str(empty)},
                {"name": "c", "url": "http://x", "token_file": str(loose)},
            ]
        }
    )
    with pytest.raises(ConfigError) as err:
        resolve_secrets(c)
    text = "\n".join(err.value.problems)
    assert "does not exist" in text and "is empty" in text and "world-readable" in text
    assert "s3cr3t-value-loose" not in text


def test_credentials_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """token_credential reads $CREDENTIALS_DIRECTORY/NAME and registers it for redaction."""
    (tmp_path / "team-a").write_text("tok-from-systemd-credential\n")
    (tmp_path / "team-a").chmod(0o600)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    c = parse_config(
        {"identities": [{"name": "a", "url": "http://x", "token_credential": "team-a"}]}
    )
    s = resolve_secrets(c)
    assert s.tokens["a"].get_secret_value() == "tok-from-systemd-credential"
    assert "tok-from-systemd-credential" not in repr(s)
    assert "tok-from-systemd-credential" in REGISTRY


def test_a_credential_loaded_from_the_units_directory_is_found_by_its_file_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped unit loads /etc/watchd/credentials whole (systemd names each file
    watchd_<file>): token_credential: team-a finds watchd_team-a; a credential in neither
    form is named with both names and where to put it."""
    (tmp_path / "watchd_team-a").write_text("tok-from-the-directory\n")
    (tmp_path / "watchd_team-a").chmod(0o600)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    c = parse_config(
        {"identities": [{"name": "a", "url": "http://x", "token_credential": "team-a"}]}
    )
    assert resolve_secrets(c).tokens["a"].get_secret_value() == "tok-from-the-directory"
    c = parse_config(
        {"identities": [{"name": "a", "url": "http://x", "token_credential": "team-b"}]}
    )
    with pytest.raises(ConfigError, match=r"neither team-b nor watchd_team-b.*/etc/watchd"):
        resolve_secrets(c)


def test_missing_env_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unset token_env is reported by variable name."""
    monkeypatch.delenv("WATCHD_TEST_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="WATCHD_TEST_TOKEN is unset"):
        resolve_secrets(parse_config(base()))


def test_pagerduty_key_shape(tmp_path: Path) -> None:
    """A PagerDuty routing key that is not 32 alphanumerics is rejected without echoing it."""
    key = tmp_path / "pd"
    key.write_text("short-key-value")
    os.chmod(key, 0o600)
    os.environ["WATCHD_TEST_TOKEN"] = "abcdefgh"
    c = parse_config(
        base(
            receivers=[{"name": "pager", "pagerduty": {"routing_key_file": str(key)}}],
            route={"receiver": "pager"},
        )
    )
    with pytest.raises(ConfigError) as err:
        resolve_secrets(c)
    assert "32 alphanumeric" in str(err.value) and "short-key-value" not in str(err.value)


def test_silence_times_are_validated_at_load() -> None:
    """A config silence with a zone-less or malformed time is rejected with its path."""
    with pytest.raises(ConfigError) as err:
        parse_config(
            base(
                silences=[
                    {"matchers": ['identity="a"'], "ends_at": "2026-12-01 08:00"},
                    {"matchers": ['identity="a"'], "ends_at": "tomorrow"},
                ]
            )
        )
    text = "\n".join(err.value.problems)
    assert "silences.0.ends_at" in text and "timezone" in text
    assert "silences.1.ends_at" in text


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (
            {"identities": [{"name": "a", "url": "https://x", "token": "abc"}]},
            "identities.0.token: unknown key: secrets are references, never inline values: "
            "use token_file, token_env or token_credential",
        ),
        (
            {
                "identities": [{"name": "a", "url": "https://x", "token_env": "X"}],
                "receivers": [{"name": "s", "slack": {"webhook_url": "https://hooks.slack"}}],
            },
            "receivers.0.slack.webhook_url: unknown key: secrets are references",
        ),
        (
            {
                "identities": [{"name": "a", "url": "https://x", "token_env": "X"}],
                "route": {"receiver": "console", "matchers": "a=b"},
            },
            "route.matchers: expected a list of matchers, e.g. ['alertname=\"ChatStuck\"']",
        ),
        (
            {
                "identities": [{"name": "a", "url": "https://x", "token_env": "X"}],
                "route": {"receiver": "console", "routes": [{"match": {"a": "b"}}]},
            },
            "route.routes.0.match: unknown key: Alertmanager's old form; write matchers:",
        ),
    ],
)
def test_common_mistakes_are_told_what_to_write(data: dict[str, object], said: str) -> None:
    """An inline secret, a matcher string where a list belongs and Alertmanager's old
    `match:` each get a message that says what to write, not pydantic's words."""
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert any(p.startswith(said) for p in err.value.problems), err.value.problems


def test_otel_variables_are_honoured_or_refused_loudly() -> None:
    """OTEL_TRACES_EXPORTER=console is honoured (it was silently ignored); an exporter or
    OTLP protocol this build cannot speak (zipkin, http/json) is a start-up problem."""
    from watchd.config.telemetry import TelemetryConfig, env_problems

    t = TelemetryConfig()
    assert t.exporter_kind({"OTEL_TRACES_EXPORTER": "console"}) == "console"
    assert t.exporter_kind({"OTEL_TRACES_EXPORTER": "none"}) == "none"
    assert env_problems({"OTEL_TRACES_EXPORTER": "console"}) == []
    assert env_problems({"OTEL_TRACES_EXPORTER": "zipkin"}) == [
        "OTEL_TRACES_EXPORTER=zipkin: not supported here; use otlp, console, none"
    ]
    (problem,) = env_problems({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    assert problem.startswith("OTEL_EXPORTER_OTLP_PROTOCOL=http/json: not supported")
