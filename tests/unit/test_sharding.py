"""Identity sharding: rendezvous hashing, the replica's own number, and HA config rules."""

from __future__ import annotations

import hashlib

import pytest

from watchd.config.fields import ConfigError
from watchd.config.loading import parse_config
from watchd.config.model import shard_index
from watchd.kits.sharding import assignment, ordinal, owned_by, owners, score

NAMES = [f"team-{i:03d}" for i in range(1000)]


def ident(name: str) -> dict[str, str]:
    return {"name": name, "url": "https://coder.example.com", "token_env": "WATCHD_TEST_TOKEN"}


def cfg(names: list[str], **extra: object) -> dict[str, object]:
    return {"identities": [ident(n) for n in names], **extra}


def test_scores_are_stable_across_processes() -> None:
    """The weight is a fixed hash (not Python's salted hash()): every replica agrees."""
    assert score("team-a", 0) == int.from_bytes(hashlib.sha256(b"team-a\x000").digest()[:8], "big")
    assert score("team-a", 0) != score("team-a", 1)


def test_every_identity_has_exactly_factor_distinct_owners() -> None:
    """Each identity gets `factor` different replicas, all in range."""
    for factor in (1, 2, 3):
        table = assignment(NAMES[:200], replicas=5, factor=factor)
        for reps in table.values():
            assert len(reps) == factor == len(set(reps))
            assert all(0 <= r < 5 for r in reps)


def test_owners_are_spread_evenly() -> None:
    """1000 identities over 4 replicas: each replica owns roughly a quarter."""
    table = assignment(NAMES, replicas=4)
    counts = [len(owned_by(table, r)) for r in range(4)]
    assert sum(counts) == 1000
    assert all(200 <= c <= 300 for c in counts), counts


@pytest.mark.parametrize(("before", "factor"), [(3, 1), (4, 1), (9, 1), (3, 2), (5, 2)])
def test_adding_a_replica_moves_about_one_nth(before: int, factor: int) -> None:
    """N → N+1 replicas: only identities gaining the new replica move (≈ factor/(N+1)),
    and no identity moves between two old replicas."""
    old = assignment(NAMES, replicas=before, factor=factor)
    new = assignment(NAMES, replicas=before + 1, factor=factor)
    moved = [n for n in NAMES if set(old[n]) != set(new[n])]
    for n in moved:
        assert before in new[n]  # the only way in is through the new replica
        assert set(old[n]) - set(new[n]) and len(set(old[n]) - set(new[n])) == 1
    share = len(moved) / len(NAMES)
    expected = factor / (before + 1)
    assert expected * 0.7 <= share <= expected * 1.3, (share, expected)


def test_removing_the_last_replica_moves_only_its_identities() -> None:
    """N → N-1: identities that were not on the removed replica keep their owners."""
    old = assignment(NAMES, replicas=4)
    new = assignment(NAMES, replicas=3)
    for n in NAMES:
        if old[n] != [3]:
            assert new[n] == old[n]


def test_bad_factor_is_refused() -> None:
    """A replication factor outside 1 … replicas is a ValueError, not a silent clamp."""
    with pytest.raises(ValueError):
        owners("x", replicas=2, factor=3)
    with pytest.raises(ValueError):
        owners("x", replicas=2, factor=0)


@pytest.mark.parametrize(
    ("name", "n"),
    [("watchd-0", 0), ("watchd-12", 12), ("my-watchd-3.watchd.ns.svc", 3), ("watchd", None)],
)
def test_pod_ordinals(name: str, n: int | None) -> None:
    """A StatefulSet pod's ordinal is the number after its last dash (domain ignored)."""
    assert ordinal(name) == n


def test_index_comes_from_config_hostname_or_pod_name() -> None:
    """index, index_from: hostname and index_from: pod_name each give the replica number."""
    c = parse_config(cfg(["a"], sharding={"replicas": 3, "index": 1}))
    assert shard_index(c) == 1
    c = parse_config(cfg(["a"], sharding={"replicas": 3, "index_from": "hostname"}))
    assert shard_index(c, hostname="watchd-2") == 2
    c = parse_config(cfg(["a"], sharding={"replicas": 3, "index_from": "pod_name"}))
    assert shard_index(c, env={"POD_NAME": "watchd-0"}) == 0


@pytest.mark.parametrize(
    ("sharding", "kw", "needle"),
    [
        ({"index_from": "hostname"}, {"hostname": "laptop"}, "does not end in a pod ordinal"),
        ({"index_from": "hostname"}, {"hostname": "watchd-3"}, "gives replica 3"),
        ({"index_from": "pod_name"}, {"env": {}}, "POD_NAME is not set"),
    ],
)
def test_an_unusable_pod_name_names_the_field(
    sharding: dict[str, object], kw: dict[str, object], needle: str
) -> None:
    """An ordinal that cannot be read or is out of range is a ConfigError naming index_from."""
    c = parse_config(cfg(["a"], sharding={"replicas": 3, **sharding}))
    with pytest.raises(ConfigError) as err:
        shard_index(c, **kw)  # type: ignore[arg-type]
    (problem,) = err.value.problems
    assert problem.startswith("sharding.index_from:") and needle in problem


@pytest.mark.parametrize(
    ("sharding", "needle"),
    [
        ({"replicas": 2, "replication_factor": 3}, "cannot exceed replicas"),
        ({"replicas": 2, "index": 2}, "out of range"),
        ({"replicas": 2}, "give index, or index_from"),
        ({"replicas": 2, "index": 0, "index_from": "hostname"}, "not both"),
        ({"replicas": 2, "index_from": "ip"}, "sharding.index_from"),
    ],
)
def test_bad_sharding_names_the_field(sharding: dict[str, object], needle: str) -> None:
    """Inconsistent sharding settings are refused with a message naming sharding."""
    with pytest.raises(ConfigError) as err:
        parse_config(cfg(["a"], sharding=sharding))
    assert any(p.startswith("sharding") and needle in p for p in err.value.problems), err.value


def test_all_replicas_owning_everything_needs_no_index() -> None:
    """replication_factor == replicas (sidecars sharing a token): no replica number needed."""
    c = parse_config(
        cfg(
            ["a", "b"],
            sharding={"replicas": 3, "replication_factor": 3},
            receivers=[{"name": "am", "alertmanager": {"url": "http://am:9093"}}],
            route={"receiver": "am"},
        )
    )
    assert shard_index(c) == 0 and [i.name for i in c.owned_identities(0)] == ["a", "b"]


def test_owned_identities_follow_the_table() -> None:
    """Replica i watches exactly the identities the assignment gives it."""
    names = [f"id-{i}" for i in range(9)]
    c = parse_config(cfg(names, sharding={"replicas": 3, "index": 0}))
    table = c.identity_owners()
    for r in range(3):
        assert [i.name for i in c.owned_identities(r)] == owned_by(table, r)
    assert sorted(n for r in range(3) for n in owned_by(table, r)) == sorted(names)


@pytest.mark.parametrize(
    "receiver",
    [
        {"webhook": {"url": "https://hooks.example.com/x"}},
        {"slack": {"webhook_url_env": "SLACK_URL"}},
        {"pagerduty": {"routing_key_env": "PD_KEY"}},
    ],
)
def test_direct_receivers_in_ha_are_refused_unless_allowed(receiver: dict[str, object]) -> None:
    """replication_factor 2 with a webhook/Slack/PagerDuty receiver is a config error naming
    the receiver and the way out; ha_direct_receivers: allow accepts it."""
    body = cfg(
        ["a"],
        sharding={"replicas": 2, "replication_factor": 2},
        receivers=[{"name": "direct", **receiver}],
        route={"receiver": "direct"},
    )
    with pytest.raises(ConfigError) as err:
        parse_config(body)
    (problem,) = err.value.problems
    assert problem.startswith("receivers.0.") and "'direct'" in problem
    assert "page once per replica" in problem and "ha_direct_receivers: allow" in problem
    body["sharding"] = {"replicas": 2, "replication_factor": 2, "ha_direct_receivers": "allow"}
    parse_config(body)


def test_shards_without_ha_may_use_direct_receivers() -> None:
    """replication_factor 1: each identity has one watcher, so a webhook pages once."""
    parse_config(
        cfg(
            ["a"],
            sharding={"replicas": 3, "index": 2},
            receivers=[{"name": "hook", "webhook": {"url": "https://hooks.example.com/x"}}],
            route={"receiver": "hook"},
        )
    )


def test_watching_off_allows_no_identities_and_only_then() -> None:
    """watching: false (a spans-only sidecar) takes no identities; otherwise one is required."""
    c = parse_config({"watching": False})
    assert c.identities == []
    with pytest.raises(ConfigError) as err:
        parse_config({"receivers": [{"name": "c", "console": {}}], "route": {"receiver": "c"}})
    assert any("watching: false" in p for p in err.value.problems)
    with pytest.raises(ConfigError) as err:
        parse_config(cfg(["a"], watching=False))
    assert any(p.startswith("identities: watching is false") for p in err.value.problems)


@pytest.mark.parametrize(
    ("am", "ok"),
    [
        ({"url": "http://am-0:9093"}, True),
        ({"urls": ["http://am-0:9093", "http://am-1:9093"]}, True),
        ({}, False),
        ({"url": "http://am-0:9093", "urls": ["http://am-1:9093"]}, False),
        ({"urls": ["http://am-0:9093", "http://am-0:9093"]}, False),
    ],
)
def test_alertmanager_receiver_takes_one_url_or_its_peers(am: dict[str, object], ok: bool) -> None:
    """An alertmanager receiver names one Alertmanager (url) or each cluster peer once (urls)."""
    body = cfg(["a"], receivers=[{"name": "am", "alertmanager": am}], route={"receiver": "am"})
    if ok:
        parse_config(body)
        return
    with pytest.raises(ConfigError) as err:
        parse_config(body)
    assert all(p.startswith("receivers.0.alertmanager") for p in err.value.problems), err.value


def test_ha_refuses_direct_receivers_anywhere_in_the_route_tree_but_not_heartbeat_only() -> None:
    """A webhook in a child route is refused in HA; one used only for each replica's own
    Watchdog heartbeat is not (every replica is meant to send that)."""
    receivers = [
        {"name": "am", "alertmanager": {"urls": ["http://am-0:9093", "http://am-1:9093"]}},
        {"name": "hook", "webhook": {"url": "https://hooks.example.com/x"}},
    ]
    child = cfg(
        ["a"],
        sharding=HA_PAIR,
        receivers=receivers,
        route={"receiver": "am", "routes": [{"matchers": ['team="x"'], "receiver": "hook"}]},
    )
    with pytest.raises(ConfigError) as err:
        parse_config(child)
    assert err.value.problems[0].startswith("receivers.1.webhook: receiver 'hook'")
    beat = cfg(
        ["a"],
        sharding=HA_PAIR,
        receivers=receivers,
        route={"receiver": "am"},
        heartbeat={"receivers": ["hook"]},
    )
    assert parse_config(beat).heartbeat.receivers == ["hook"]


HA_PAIR = {"replicas": 2, "replication_factor": 2}
