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

from watchd import __version__, logs
from watchd.alerting import routing
from watchd.config import (
    DEFAULT_CONFIG_PATH,
    Config,
    ConfigError,
    ResolvedSecrets,
    load_config,
    resolve_secrets,
)

# SIGTERM must end the process well inside Kubernetes' and systemd's grace period;
# if the ordered shutdown hangs past this, the process exits hard.
HARD_EXIT_AFTER = 9.0


def _config_path(arg: str | None) -> str:
    return arg or os.environ.get("WATCHD_CONFIG") or DEFAULT_CONFIG_PATH


def _load(path: str) -> tuple[Config, ResolvedSecrets]:
    config = load_config(path)
    return config, resolve_secrets(config)


def _load_or_report(args: argparse.Namespace) -> tuple[Config, ResolvedSecrets] | None:
    """The command's config and secrets, or None after printing every problem."""
    try:
        return _load(_config_path(args.config))
    except ConfigError as exc:
        _print_problems(exc)
        return None


def _print_problems(exc: ConfigError) -> None:
    print("invalid configuration:", file=sys.stderr)
    for p in exc.problems:
        print(f"  {p}", file=sys.stderr)


def cmd_check_config(args: argparse.Namespace) -> int:
    path = _config_path(args.config)
    loaded = _load_or_report(args)
    if loaded is None:
        return 2
    config, _ = loaded
    print(f"{path}: valid")
    print(f"identities: {', '.join(i.name for i in config.identities)}")
    print(f"receivers: {', '.join(f'{r.name} ({r.kind})' for r in config.receivers)}")
    print("route tree:")
    for line in routing.describe(routing.build(config.route)):
        print("  " + line)
    return 0


def cmd_scan(args: argparse.Namespace) -> int:
    from watchd import scanning

    loaded = _load_or_report(args)
    if loaded is None:
        return 2
    config, secrets = loaded
    results = asyncio.run(scanning.scan(config, secrets))
    if args.json:
        print(json.dumps({"results": [asdict(r) for r in results]}, indent=1))
    else:
        print(scanning.render(results))
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

    path = _config_path(args.config)
    loaded = _load_or_report(args)
    if loaded is None:
        return 2
    config, secrets = loaded

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
    return asyncio.run(main())


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
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.stop()
        return 0

    return asyncio.run(main())


def cmd_test_alert(args: argparse.Namespace) -> int:
    from watchd import testalert

    loaded = _load_or_report(args)
    if loaded is None:
        return 2
    config, secrets = loaded
    if args.receiver not in {r.name for r in config.receivers}:
        print(
            f"no receiver named {args.receiver!r} (have: "
            f"{', '.join(r.name for r in config.receivers)})",
            file=sys.stderr,
        )
        return 2
    return asyncio.run(testalert.send(config, secrets, args.receiver))


def cmd_silence(args: argparse.Namespace) -> int:
    from watchd import silencectl

    loaded = _load_or_report(args)
    if loaded is None:
        return 2
    config, secrets = loaded
    return asyncio.run(silencectl.run(config, secrets, args))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="watchd", description="Monitor Coder Agents chats.")
    p.add_argument("--version", action="version", version=f"watchd {__version__}")
    p.add_argument(
        "--log-level",
        default=os.environ.get("WATCHD_LOG_LEVEL", "info"),
        choices=["debug", "info", "warning", "error"],
    )
    p.add_argument("--log-format", choices=["auto", "json", "console"], default="auto")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("-c", "--config")
    run.set_defaults(func=cmd_run)

    check = sub.add_parser("check-config", help="validate config and secrets; print routes")
    check.add_argument("-c", "--config")
    check.set_defaults(func=cmd_check_config)

    scan = sub.add_parser("scan", help="list every identity's chats once; print stuck ones")
    scan.add_argument("-c", "--config")
    scan.add_argument("--json", action="store_true")
    scan.set_defaults(func=cmd_scan)

    demo = sub.add_parser("demo", help="simulator + daemon, console output")
    demo.add_argument(
        "--duration", type=float, default=90.0, help="seconds to run (0: until Ctrl-C)"
    )
    demo.add_argument("--listen", default="127.0.0.1:9310")
    demo.set_defaults(func=cmd_demo)

    test_alert = sub.add_parser("test-alert", help="send a synthetic alert and its resolve")
    test_alert.add_argument("receiver")
    test_alert.add_argument("-c", "--config")
    test_alert.set_defaults(func=cmd_test_alert)

    silence = sub.add_parser("silence", help="manage runtime silences on a running daemon")
    silence.add_argument("-c", "--config")
    ssub = silence.add_subparsers(dest="action", required=True)
    add = ssub.add_parser("add", help="silence alerts matching all matchers")
    add.add_argument("matchers", nargs="+", help='e.g. identity="team-a" alertname=~"Chat.*"')
    add.add_argument("--duration", default="2h")
    add.add_argument("--comment", default="")
    add.add_argument("--author", default=os.environ.get("USER", "cli"))
    ssub.add_parser("list", help="list silences")
    expire = ssub.add_parser("expire", help="end a silence now")
    expire.add_argument("id")
    silence.set_defaults(func=cmd_silence)

    sim = sub.add_parser("sim", help="the Coder simulator alone")
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
