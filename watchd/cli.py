"""The ``watchd`` command: run, check-config, scan, demo, sim.

Exit codes follow README's command table: 2 for invalid configuration (one
problem per line, naming its field path), 0 after a clean shutdown.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from watchd import __version__
from watchd.alerting import routing
from watchd.config.fields import ConfigError
from watchd.config.loading import DEFAULT_CONFIG_PATH, load_config
from watchd.config.model import Config
from watchd.config.process import shard_index
from watchd.config.secrets import ResolvedSecrets, resolve_secrets
from watchd.kits import logs
from watchd.kits.redaction import REGISTRY

# SIGTERM must end the process well inside Kubernetes' and systemd's grace period;
# if the ordered shutdown hangs past this, the process exits hard.
HARD_EXIT_AFTER = 9.0


def _config_path(arg: str | None) -> str:
    return arg or os.environ.get("WATCHD_CONFIG") or DEFAULT_CONFIG_PATH


def _load_config_or_report(args: argparse.Namespace) -> Config | None:
    """The command's config, or None after printing every problem."""
    try:
        return load_config(_config_path(args.config))
    except ConfigError as exc:
        _print_problems(exc.problems)
        return None


def _load_or_report(args: argparse.Namespace) -> tuple[Config, ResolvedSecrets] | None:
    """The config and every secret (what ``run`` needs), or None after printing problems."""
    config = _load_config_or_report(args)
    if config is None:
        return None
    try:
        return config, resolve_secrets(config)
    except ConfigError as exc:
        _print_problems(exc.problems)
        return None


def _print_problems(problems: Sequence[str], header: str = "invalid configuration:") -> None:
    print(header, file=sys.stderr)
    for p in problems:
        print(f"  {p}", file=sys.stderr)


def _preflight(config: Config) -> list[str]:
    """What ``run`` would die on before doing anything: state_dir, the listen address."""
    from watchd.daemon import preflight

    problems = []
    state = preflight.check_state_dir(preflight.effective_state_dir(config.state_dir))
    if state:
        problems.append(state)
    listen = preflight.check_listen(config.server.listen)
    if listen:
        problems.append(listen)
    try:
        shard_index(config)
    except ConfigError as exc:
        problems.extend(exc.problems)
    return problems


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


def cmd_check_config(args: argparse.Namespace) -> int:
    path = _config_path(args.config)
    config = _load_config_or_report(args)
    if config is None:
        return 2
    # Every secret is tried and every problem listed; none stops the rest of the check.
    secret_problems = list(resolve_secrets(config, strict=False).problems)
    run_problems = _preflight(config)
    tree = routing.describe(routing.build(config.route))
    if args.replicas is not None and not 1 <= args.replicas <= 1000:
        _print_problems(["--replicas: give a number from 1 to 1000"], "invalid arguments:")
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
        _print_problems(secret_problems, "unavailable secrets:")
    if run_problems:
        _print_problems(run_problems, "`watchd run` would fail:")
    return 2 if secret_problems or run_problems else 0


def cmd_scan(args: argparse.Namespace) -> int:
    from watchd import scanning

    config = _load_config_or_report(args)
    if config is None:
        return 2
    # Tokens only: a receiver's secret has nothing to do with listing chats, and an
    # identity whose token is unavailable is reported while the others are scanned.
    secrets = resolve_secrets(config, receivers=(), server=False, strict=False)
    results = asyncio.run(scanning.scan(config, secrets))
    # Last line of defence: whatever a server echoed (a token in an error) is scrubbed.
    if args.json:
        print(REGISTRY.scrub(json.dumps({"results": [asdict(r) for r in results]}, indent=1)))
    else:
        print(REGISTRY.scrub(scanning.render(results)))
    return scanning.exit_code(results)


def _hard_exit_timer() -> None:
    def bail() -> None:
        sys.stderr.write("watchd: shutdown exceeded its deadline; exiting hard\n")
        sys.stderr.flush()
        os._exit(1)

    timer = threading.Timer(HARD_EXIT_AFTER, bail)
    timer.daemon = True
    timer.start()


def cmd_run(args: argparse.Namespace) -> int:
    from watchd.daemon.app import Daemon
    from watchd.daemon.preflight import StartupError

    path = _config_path(args.config)
    loaded = _load_or_report(args)
    if loaded is None:
        return 2
    config, secrets = loaded
    problems = _preflight(config)
    if problems:
        for p in problems:
            print(f"watchd: cannot start: {p}", file=sys.stderr)
        return 2

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(name: str) -> None:
            logs.get("watchd").info("signal.received", signal=name)
            if not stop.is_set():
                _hard_exit_timer()
            stop.set()

        daemon = Daemon(config, secrets, config_path=path)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig.name)
        reloading: set[asyncio.Task[bool]] = set()

        def on_hup() -> None:
            logs.get("watchd").info("signal.received", signal="SIGHUP")
            task = asyncio.ensure_future(daemon.reload())
            reloading.add(task)
            task.add_done_callback(reloading.discard)

        loop.add_signal_handler(signal.SIGHUP, on_hup)
        return await daemon.run(stop)

    # Everything alive now (modules, classes, the config) lives as long as the process:
    # keep it out of the cyclic collector's full passes, which otherwise rescan it all.
    gc.collect()
    gc.freeze()
    try:
        return asyncio.run(main())
    except StartupError as exc:  # the same checks lost a race (e.g. the port got taken)
        print(f"watchd: cannot start: {exc}", file=sys.stderr)
        return 2


def cmd_demo(args: argparse.Namespace) -> int:
    from watchd import demo

    return demo.main(args.duration, args.listen)


def cmd_sim(args: argparse.Namespace) -> int:
    from watchd.sim.scenarios import SCENARIOS, bulk
    from watchd.sim.server import SimServer
    from watchd.sim.state import SimState

    host, _, port = args.listen.rpartition(":")

    async def main() -> int:
        state = SimState(
            era=args.era,
            seed=args.seed,
            clock_offset=args.clock_offset,
            ping_interval=args.ping_interval,
        )
        if args.scenario == "bulk":
            identities = bulk(
                state,
                users=args.users,
                chats_per_user=args.chats_per_user,
                status=args.chat_status,
                age=args.chat_age,
            )
        else:
            identities = SCENARIOS[args.scenario](state)
        server = SimServer(state)
        url = await server.start(host or "127.0.0.1", int(port or 0))
        # Handlers before the announcement: whoever reads it may signal at once.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print(
            json.dumps(
                {
                    "url": url,
                    "era": args.era,
                    "identities": [
                        {"name": i.name, "username": i.username, "token": i.token}
                        for i in identities
                    ],
                }
            ),
            flush=True,
        )
        await stop.wait()
        await server.stop()
        return 0

    return asyncio.run(main())


def cmd_test_alert(args: argparse.Namespace) -> int:
    from watchd import testalert

    config = _load_config_or_report(args)
    if config is None:
        return 2
    if args.receiver not in {r.name for r in config.receivers}:
        print(
            f"test-alert failed: no receiver named {args.receiver!r} (have: "
            f"{', '.join(r.name for r in config.receivers)})",
            file=sys.stderr,
        )
        return 1
    # Only this receiver's secret: no token, no other receiver's key is read.
    secrets = resolve_secrets(
        config, identities=False, receivers={args.receiver}, server=False, strict=False
    )
    if secrets.problems:
        _print_problems(secrets.problems, f"test-alert failed: {args.receiver}'s secret:")
        return 1
    return asyncio.run(testalert.send(config, secrets, args.receiver))


def cmd_silence(args: argparse.Namespace) -> int:
    from watchd import silencectl

    return silencectl.main(args, config_path=_config_path(args.config))


def _global_options(*, defaults: bool) -> argparse.ArgumentParser:
    """Options every command accepts, before or after its name.

    The top-level parser holds the defaults; each sub-command's copy defaults to
    SUPPRESS, so a value given after the sub-command wins and an absent one does
    not overwrite a value given before it.
    """

    def d(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    g = argparse.ArgumentParser(add_help=False)
    opts = g.add_argument_group("global options")
    opts.add_argument(
        "-c", "--config", default=d(None), help="config file (else $WATCHD_CONFIG, else /etc/…)"
    )
    opts.add_argument(
        "--log-level",
        default=d(os.environ.get("WATCHD_LOG_LEVEL", "info")),
        choices=["debug", "info", "warning", "error"],
    )
    opts.add_argument("--log-format", choices=["auto", "json", "console"], default=d("auto"))
    opts.add_argument(
        "--json", action="store_true", default=d(False), help="machine-readable output"
    )
    return g


def build_parser() -> argparse.ArgumentParser:
    common = [_global_options(defaults=False)]
    p = argparse.ArgumentParser(
        prog="watchd",
        description="Monitor Coder Agents chats.",
        parents=[_global_options(defaults=True)],
    )
    p.add_argument("--version", action="version", version=f"watchd {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the daemon", parents=common)
    run.set_defaults(func=cmd_run)

    check = sub.add_parser(
        "check-config", help="validate config and secrets; print routes", parents=common
    )
    check.add_argument(
        "--replicas",
        type=int,
        metavar="N",
        help="print which replicas would own each identity with N replicas "
        "(default: sharding.replicas)",
    )
    check.set_defaults(func=cmd_check_config)

    scan = sub.add_parser(
        "scan", help="list every identity's chats once; print stuck ones", parents=common
    )
    scan.set_defaults(func=cmd_scan)

    demo = sub.add_parser("demo", help="simulator + daemon, console output", parents=common)
    demo.add_argument(
        "--duration", type=float, default=90.0, help="seconds to run (0: until Ctrl-C)"
    )
    demo.add_argument("--listen", default="127.0.0.1:9310")
    demo.set_defaults(func=cmd_demo)

    test_alert = sub.add_parser(
        "test-alert", help="send a synthetic alert and its resolve", parents=common
    )
    test_alert.add_argument("receiver")
    test_alert.set_defaults(func=cmd_test_alert)

    silence = sub.add_parser(
        "silence", help="manage runtime silences on a running daemon", parents=common
    )
    conn = argparse.ArgumentParser(add_help=False)
    where = conn.add_argument_group("daemon")
    where.add_argument(
        "--url", default=argparse.SUPPRESS, help="the daemon (default: http://server.listen)"
    )
    where.add_argument(
        "--token-file",
        default=argparse.SUPPRESS,
        help="admin token file (else $WATCHD_ADMIN_TOKEN, else server.admin_token)",
    )
    silence.add_argument("--url", default=None, help=argparse.SUPPRESS)
    silence.add_argument("--token-file", default=None, help=argparse.SUPPRESS)
    ssub = silence.add_subparsers(dest="action", required=True)
    both = [*common, conn]
    add = ssub.add_parser("add", help="silence alerts matching all matchers", parents=both)
    add.add_argument("matchers", nargs="+", help='e.g. identity="team-a" alertname=~"Chat.*"')
    add.add_argument("--duration", default="2h")
    add.add_argument("--comment", default="")
    add.add_argument("--author", default=os.environ.get("USER", "cli"))
    ssub.add_parser("list", help="list silences", parents=both)
    expire = ssub.add_parser("expire", help="end a silence now", parents=both)
    expire.add_argument("id")
    silence.set_defaults(func=cmd_silence)

    sim = sub.add_parser("sim", help="the Coder simulator alone", parents=common)
    sim.add_argument("--listen", default="127.0.0.1:7080")
    sim.add_argument("--scenario", default="demo", choices=["empty", "demo", "fleet", "bulk"])
    sim.add_argument("--users", type=int, default=50, help="bulk scenario: users")
    sim.add_argument("--chats-per-user", type=int, default=2000, help="bulk scenario")
    sim.add_argument("--chat-status", default="waiting", help="bulk scenario: every chat's status")
    sim.add_argument(
        "--chat-age",
        type=float,
        default=60.0,
        help="bulk scenario: seconds each chat has been in its status",
    )
    sim.add_argument("--era", default="E", choices=list("ABCDE"))
    sim.add_argument("--seed", type=int, default=1)
    sim.add_argument(
        "--clock-offset",
        type=float,
        default=0.0,
        help="seconds the simulated server's clock is ahead of the host's",
    )
    sim.add_argument("--ping-interval", type=float, default=15.0)
    sim.set_defaults(func=cmd_sim)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    fmt = args.log_format
    quiet = args.command == "demo"
    logs.configure(
        level="warning" if quiet and args.log_level == "info" else args.log_level,
        json=None if fmt == "auto" else fmt == "json",
    )
    rc: int = args.func(args)
    return rc
