"""Matchers, the route tree, group keys, and the notification-log dedup rule."""

from __future__ import annotations

import pytest

from watchd.alerting import routing
from watchd.alerting.nflog import NflogEntry, needs_update
from watchd.config.alerting import RouteConfig
from watchd.kits.matchers import MatcherError, parse_matcher


@pytest.mark.parametrize(
    ("matcher", "labels", "hit"),
    [
        ('severity="critical"', {"severity": "critical"}, True),
        ('severity="critical"', {"severity": "warning"}, False),
        ('severity!="critical"', {}, True),
        ('identity=~"team-.*"', {"identity": "team-a"}, True),
        ('identity=~"team"', {"identity": "team-a"}, False),  # anchored
        ('identity!~"team-(a|b)"', {"identity": "team-c"}, True),
        ('owner=""', {}, True),
        ("status=running", {"status": "running"}, True),
        ('title="say \\"hi\\""', {"title": 'say "hi"'}, True),
    ],
)
def test_matchers(matcher: str, labels: dict[str, str], hit: bool) -> None:
    """Alertmanager matcher semantics, regexes anchored, missing labels empty."""
    assert parse_matcher(matcher).matches(labels) is hit


@pytest.mark.parametrize("bad", ["severity", "=x", 'a=~"("', "1a=b", 'a="unterminated'])
def test_bad_matchers(bad: str) -> None:
    """Malformed matchers are rejected with the offending text."""
    with pytest.raises(MatcherError):
        parse_matcher(bad)


TREE = RouteConfig.model_validate(
    {
        "receiver": "default",
        "group_wait": "10s",
        "routes": [
            {
                "matchers": ['severity="critical"'],
                "receiver": "pager",
                "continue": True,
                "group_by": ["identity"],
            },
            {
                "matchers": ['identity="team-a"'],
                "receiver": "team-a",
                "routes": [
                    {
                        "matchers": ['alertname="ChatStranded"'],
                        "receiver": "team-a-tools",
                        "repeat_interval": "1h",
                    }
                ],
            },
            {"matchers": ['identity="team-a"'], "receiver": "never"},
        ],
    }
)


@pytest.mark.parametrize(
    ("labels", "receivers"),
    [
        ({"identity": "team-b"}, ["default"]),
        ({"identity": "team-a", "alertname": "ChatStuck"}, ["team-a"]),
        ({"identity": "team-a", "alertname": "ChatStranded"}, ["team-a-tools"]),
        ({"identity": "team-a", "severity": "critical"}, ["pager", "team-a"]),
        ({"identity": "team-z", "severity": "critical"}, ["pager"]),
    ],
)
def test_route_tree(labels: dict[str, str], receivers: list[str]) -> None:
    """First matching child wins unless it says continue; no match falls back to the parent."""
    root = routing.build(TREE)
    assert [r.receiver for r in root.match(labels)] == receivers


def test_options_inherit() -> None:
    """Children inherit unset options; defaults follow Alertmanager."""
    root = routing.build(TREE)
    leaf = root.match({"identity": "team-a", "alertname": "ChatStranded"})[0]
    assert (leaf.group_wait, leaf.group_interval, leaf.repeat_interval) == (10, 300, 3600)
    assert leaf.group_by == ("identity", "alertname", "status")
    pager = root.match({"severity": "critical"})[0]
    assert pager.group_by == ("identity",)


def test_group_key_uses_only_group_by_labels() -> None:
    """Alerts differing only outside group_by share a group."""
    root = routing.build(RouteConfig.model_validate({"receiver": "r"}))
    a = {"identity": "x", "alertname": "ChatStuck", "status": "running", "chat_id": "1"}
    b = {**a, "chat_id": "2"}
    assert root.group_key(a) == root.group_key(b)
    assert root.group_key(a) != root.group_key({**a, "status": "pending"})


def test_describe_prints_the_resolved_tree() -> None:
    """check-config's rendering shows every node with inherited timings."""
    lines = routing.describe(routing.build(TREE))
    assert lines[0].startswith("- (all alerts) -> default")
    assert any("team-a-tools" in line and "10s/5m/1h" in line for line in lines)
    assert any("continue" in line for line in lines)


def entry(firing: set[str], resolved: set[str], sent_at: float = 1000.0) -> NflogEntry:
    return NflogEntry("r", "g", frozenset(firing), frozenset(resolved), sent_at, 1e12)


@pytest.mark.parametrize(
    ("prev", "firing", "resolved", "now", "send"),
    [
        (None, {"a"}, set(), 1001, True),  # first notification
        (None, set(), {"a"}, 1001, False),  # never told: nothing to resolve
        (entry({"a"}, set()), {"a"}, set(), 1001, False),  # nothing new
        (entry({"a"}, set()), {"a", "b"}, set(), 1001, True),  # a new firing alert
        (entry({"a", "b"}, set()), {"a"}, {"b"}, 1001, True),  # b resolved
        (entry({"a"}, {"b"}), {"a"}, {"b"}, 1001, False),  # resolve already sent
        (entry({"a"}, set()), set(), {"a"}, 1001, True),  # all resolved
        (entry(set(), {"a"}), set(), {"a"}, 1001, False),  # already told
        (entry({"a"}, set(), 1000), {"a"}, set(), 1000 + 3601, True),  # repeat interval
    ],
)
def test_dedup_decisions(
    prev: NflogEntry | None, firing: set[str], resolved: set[str], now: float, send: bool
) -> None:
    """The notification log decides: new firing, newly resolved, or a repeat."""
    assert needs_update(prev, firing, resolved, repeat=3600, send_resolved=True, now=now) is send


def test_group_key_remembered_is_the_formatted_key() -> None:
    """A remembered group key is the text formatting would give, also past the bound."""
    root = routing.build(RouteConfig.model_validate({"receiver": "r"}))
    labels = {"identity": "x'y", "alertname": "ChatStuck", "status": "running"}
    want = "root:{identity=\"x'y\",alertname='ChatStuck',status='running'}"
    assert root.group_key(labels) == want
    assert root.group_key(dict(labels)) == want  # remembered
    assert root.group_key({"identity": "x"}) == "root:{identity='x',alertname='',status=''}"
    for i in range(routing.MAX_KEYS + 10):
        root.group_key({**labels, "identity": str(i)})
    assert root.group_key(labels) == want
    assert root == routing.build(RouteConfig.model_validate({"receiver": "r"}))
    assert hash(root) == hash(routing.build(RouteConfig.model_validate({"receiver": "r"})))
