"""``watchd check-config``: validate the config and every secret, print the route tree.

Every problem is listed (none stops the rest of the check): the config's, each
unavailable secret's, and what ``watchd run`` would die on. Exit 2 when there
is any, else 0. ``--offline`` checks the file and its semantics only (no secret read,
no state_dir, listen address or environment), so it can gate CI and a reload on a
host where the daemon is running. With ``--replicas N`` (or a sharded config) it also prints which
replica owns each identity.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from watchd.alerting import routing
from watchd.commands.configuring import (
    config_path,
    load_config_or_report,
    preflight,
    print_problems,
)
from watchd.config.model import Config
from watchd.config.secrets import resolve_secrets


def _sharding_report(config: Config, replicas: int | None) -> dict[str, Any]:
    """Who owns which identity with ``replicas`` replicas (the configured count by
    default), and why HA refuses direct receivers."""
    from watchd.kits.sharding import assignment, owned_by

    sh = config.sharding
    n = replicas if replicas is not None else sh.replicas
    factor = min(sh.replication_factor, n)
    table = assignment((i.name for i in config.identities), replicas=n, factor=factor)
    out: dict[str, Any] = {
        "replicas": n,
        "replication_factor": factor,
        "owners": table,
        "by_replica": {str(r): owned_by(table, r) for r in range(n)},
    }
    if replicas is not None and replicas != sh.replicas and sh.replicas > 0:
        before = assignment(
            (i.name for i in config.identities), replicas=sh.replicas, factor=sh.replication_factor
        )
        out["moved_from_configured"] = sorted(
            name for name in table if set(table[name]) != set(before.get(name, []))
        )
    if factor >= 2:
        out["ha"] = (
            f"{factor} replicas alert for every identity: send alerts through an "
            "Alertmanager cluster (its peers keep one notification per group); direct "
            "webhook, Slack and PagerDuty receivers would page once per replica and are "
            "refused unless sharding.ha_direct_receivers is allow"
            + (" (it is)" if sh.ha_direct_receivers == "allow" else "")
        )
    return out


def main(args: argparse.Namespace) -> int:
    path = config_path(args.config)
    config = load_config_or_report(args)
    if config is None:
        return 2
    # Every secret is tried and every problem listed; none stops the rest of the check.
    # --offline: the file and its semantics only (what a running daemon on this host, or
    # secrets only its unit can read, would otherwise make a failure).
    offline = getattr(args, "offline", False)
    secret_problems = [] if offline else list(resolve_secrets(config, strict=False).problems)
    run_problems = [] if offline else preflight(config)
    tree = routing.describe(routing.build(config.route))
    if args.replicas is not None and not 1 <= args.replicas <= 1000:
        print_problems(["--replicas: give a number from 1 to 1000"], "invalid arguments:")
        return 2
    shards = _sharding_report(config, args.replicas)
    show_shards = args.replicas is not None or config.sharding.replicas > 1
    if args.json:
        print(
            json.dumps(
                {
                    "path": path,
                    "valid": not (secret_problems or run_problems),
                    "problems": secret_problems + run_problems,
                    "identities": [i.name for i in config.identities],
                    "receivers": [{"name": r.name, "kind": r.kind} for r in config.receivers],
                    "route_tree": tree,
                    "watching": config.watching,
                    "sharding": shards,
                },
                indent=1,
            )
        )
    else:
        verdict = "valid" if not (secret_problems or run_problems) else "parsed, with problems"
        if offline:
            verdict += " (offline: secrets, state_dir and listen address not checked)"
        print(f"{path}: {verdict}")
        if config.watching:
            print(f"identities: {', '.join(i.name for i in config.identities)}")
        else:
            print("identities: none (watching: false; transport events become spans)")
        if show_shards:
            print(
                f"sharding: {shards['replicas']} replicas, replication factor "
                f"{shards['replication_factor']} (rendezvous hashing of identity names)"
            )
            for r, names in shards["by_replica"].items():
                print(f"  replica {r}: {', '.join(names) or '(none)'}")
            if "moved_from_configured" in shards:
                moved = shards["moved_from_configured"]
                print(
                    f"  from {config.sharding.replicas} to {shards['replicas']} replicas moves "
                    f"{len(moved)} of {len(config.identities)} identities"
                    + (f": {', '.join(moved)}" if moved else "")
                )
            if "ha" in shards:
                print(f"  HA: {shards['ha']}")
        print(f"receivers: {', '.join(f'{r.name} ({r.kind})' for r in config.receivers)}")
        print("route tree:")
        for line in tree:
            print("  " + line)
    if secret_problems:
        print_problems(secret_problems, "unavailable secrets:")
    if run_problems:
        print_problems(run_problems, "`watchd run` would fail:")
    return 2 if secret_problems or run_problems else 0
