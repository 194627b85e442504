"""Strict configuration: Alertmanager's matcher grammar, unique YAML keys, duration floors."""

from __future__ import annotations

from pathlib import Path

import pytest

from watchd.config.fields import ConfigError
from watchd.config.loading import load_config, parse_config
from watchd.kits.matchers import MatcherError, parse_matcher


def base(**extra: object) -> dict[str, object]:
    return {
        "identities": [
            {"name": "team-a", "url": "https://coder.example.com", "token_env": "WATCHD_TEST_TOKEN"}
        ],
        **extra,
    }


@pytest.mark.parametrize(
    "bad",
    [
        "severity==critical",
        "severity=!critical",
        "severity=~~x",
        "severity=crit ical",
        'severity="critical',
        "severity='critical'",
        'severity="a\\qb"',
        "severity",
        "=critical",
        "sev-erity=critical",
        'severity="a"b',
    ],
)
def test_matcher_grammar_is_alertmanagers_exactly(bad: str) -> None:
    """Anything outside name (=|!=|=~|!~) value-or-"quoted value" is an error naming it."""
    with pytest.raises(MatcherError) as err:
        parse_matcher(bad)
    assert repr(bad) in str(err.value)


@pytest.mark.parametrize(
    ("text", "name", "op", "value"),
    [
        ("severity=critical", "severity", "=", "critical"),
        ('severity = "critical"', "severity", "=", "critical"),
        ("owner=", "owner", "=", ""),
        ('title="a \\"b\\" \\\\ c"', "title", "=", 'a "b" \\ c'),
        ('x="line\\nbreak"', "x", "=", "line\nbreak"),
        ('alertname=~"Chat.*"', "alertname", "=~", "Chat.*"),
        ("team!~a|b", "team", "!~", "a|b"),
    ],
)
def test_matcher_grammar_accepts_every_valid_form(
    text: str, name: str, op: str, value: str
) -> None:
    """Unquoted, quoted with escapes, empty values and all four operators parse."""
    m = parse_matcher(text)
    assert (m.name, m.op, m.value) == (name, op, value)
    assert parse_matcher(str(m)) == m


def test_double_equals_in_route_silence_inhibit_and_sweep_is_an_error() -> None:
    """`severity==critical` in any matcher list of the config names its path and the matcher."""
    with pytest.raises(ConfigError) as err:
        parse_config(
            base(
                route={"receiver": "console", "routes": [{"matchers": ["severity==critical"]}]},
                silences=[{"matchers": ["team==a"], "ends_at": "2030-01-01T00:00:00Z"}],
                inhibit_rules=[{"source_matchers": ["a==b"], "target_matchers": ["c=d"]}],
            )
        )
    problems = "\n".join(err.value.problems)
    assert "route.routes.0.matchers: bad matcher 'severity==critical'" in problems
    assert "silences.0.matchers: bad matcher 'team==a'" in problems
    assert "inhibit_rules.0.source_matchers: bad matcher 'a==b'" in problems


def test_duplicate_yaml_keys_name_key_and_lines(tmp_path: Path) -> None:
    """A key given twice in one mapping is an error with the key and both lines."""
    cfg = tmp_path / "w.yaml"
    cfg.write_text(
        "identities:\n"
        "  - name: team-a\n"
        "    url: https://coder.example.com\n"
        "    token_env: T\n"
        "reconcile_interval: 60s\n"
        "budgets:\n"
        "  running: 30m\n"
        "  running: 1m\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert err.value.problems == [f"{cfg}: line 8: duplicate key 'running' (first given at line 7)"]


def test_duplicate_top_level_key_is_an_error(tmp_path: Path) -> None:
    """Duplicates at the top level are caught too (the last one used to win silently)."""
    cfg = tmp_path / "w.yaml"
    cfg.write_text("state_dir: /a\nidentities: []\nstate_dir: /b\n")
    with pytest.raises(ConfigError, match=r"line 3: duplicate key 'state_dir'"):
        load_config(cfg)


@pytest.mark.parametrize(
    ("extra", "path", "floor"),
    [
        ({"reconcile_interval": 0}, "reconcile_interval", "5s"),
        ({"reconcile_interval": "4s"}, "reconcile_interval", "5s"),
        ({"route": {"receiver": "console", "group_interval": "0s"}}, "route.group_interval", "1s"),
        (
            {"route": {"receiver": "console", "routes": [{"repeat_interval": "500ms"}]}},
            "route.routes.0.repeat_interval",
            "1s",
        ),
        ({"budgets": {"running": 0}}, "budgets.running", "1s"),
        ({"quota": {"interval": "0s"}}, "quota.interval", "1s"),
        ({"sweep": {"interval": "10ms"}}, "sweep.interval", "1s"),
        ({"telemetry": {"timeout": 0}}, "telemetry.timeout", "100ms"),
    ],
)
def test_durations_below_their_floor_are_errors_stating_it(
    extra: dict[str, object], path: str, floor: str
) -> None:
    """A zero or tiny interval is refused, the error naming the field and its minimum."""
    with pytest.raises(ConfigError) as err:
        parse_config(base(**extra))
    line = next(p for p in err.value.problems if p.startswith(path + ":"))
    assert f"below the minimum of {floor}" in line


def test_durations_at_their_floor_are_accepted() -> None:
    """The floors are inclusive: 5s reconcile and 1s group_interval are valid."""
    c = parse_config(
        base(reconcile_interval="5s", route={"receiver": "console", "group_interval": "1s"})
    )
    assert c.reconcile_interval == 5 and c.route.group_interval == 1
