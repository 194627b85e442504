"""The ``watchd`` command line: its arguments and the dispatch to a sub-command, nothing else.

Each sub-command is a module of :mod:`watchd.commands`, imported only when that
command runs: ``watchd run`` never loads the simulator, the demo or the scan.
Exit codes follow README's command table: 2 for invalid configuration (one
problem per line, naming its field path), 0 after a clean shutdown.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import sys
from collections.abc import Sequence

from watchd.buildinfo import version_line
from watchd.kits import logs


# Each sub-command's module is imported here, when it runs, and not at the top.
def cmd_run(args: argparse.Namespace) -> int:
    from watchd.commands import run

    return run.main(args)


def cmd_check_config(args: argparse.Namespace) -> int:
    from watchd.commands import check_config

    return check_config.main(args)


def cmd_scan(args: argparse.Namespace) -> int:
    from watchd.commands import scan

    return scan.main(args)


def cmd_demo(args: argparse.Namespace) -> int:
    from watchd.commands import demo

    return demo.main(args)


def cmd_sim(args: argparse.Namespace) -> int:
    from watchd.commands import sim

    return sim.main(args)


def cmd_test_alert(args: argparse.Namespace) -> int:
    from watchd.commands import test_alert

    return test_alert.main(args)


def cmd_silence(args: argparse.Namespace) -> int:
    from watchd.commands import silence

    return silence.main(args)


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
    p.add_argument("--version", action="version", version=version_line())
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
    check.add_argument(
        "--offline",
        action="store_true",
        help="check the file and its semantics only (no secrets read, no state_dir, listen "
        "address or environment looked at): for CI gates and a pre-reload hook on a live "
        "host, as `promtool check config` or `nginx -t`",
    )
    check.set_defaults(func=cmd_check_config)

    scan = sub.add_parser(
        "scan", help="list every identity's chats once; print stuck ones", parents=common
    )
    scan.add_argument(
        "--cost",
        action="store_true",
        help="also read what each stuck chat's tree has cost (AI Gateway; bounded)",
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
    exits = (
        "exit status: 0 done, 1 failed (bad matcher, daemon unreachable or refusing), "
        "2 invalid config without --url"
    )
    add = ssub.add_parser(
        "add",
        help="silence alerts matching all matchers",
        parents=both,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog='example:\n  watchd silence add identity="team-a" alertname=~"Chat.*" '
        '--duration 4h --comment "maintenance"\n  (prints the new silence\'s id)\n\n' + exits,
    )
    add.add_argument("matchers", nargs="+", help='e.g. identity="team-a" alertname=~"Chat.*"')
    add.add_argument(
        "--duration", default="2h", help="how long it lasts, from now (default: %(default)s)"
    )
    add.add_argument("--comment", default="", help="why (shown in list and /status)")
    add.add_argument(
        "--author",
        default=os.environ.get("USER", "cli"),
        help="who (default: $USER, here %(default)s)",
    )
    ssub.add_parser(
        "list",
        help="list silences",
        parents=both,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  watchd silence list\n  watchd silence list --json\n\n" + exits,
    )
    expire = ssub.add_parser(
        "expire",
        help="end a silence now",
        parents=both,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  watchd silence expire 3f2a9c1e\n\n" + exits,
    )
    expire.add_argument("id")
    silence.set_defaults(func=cmd_silence)

    sim = sub.add_parser("sim", help="the Coder simulator alone", parents=common)
    sim.add_argument("--listen", default="127.0.0.1:7080")
    sim.add_argument(
        "--scenario", default="demo", choices=["empty", "demo", "fleet", "bulk", "trees"]
    )
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
    sim.add_argument(
        "--tls",
        action="store_true",
        help="serve HTTPS with a generated CA and certificate (its ca_file in the startup line)",
    )
    sim.set_defaults(func=cmd_sim)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # A fatal signal (SIGSEGV, SIGBUS: a state file made immutable under a memory map,
    # a full disk behind one) says what happened and where on stderr, not nothing.
    if not faulthandler.is_enabled():
        # (not where stderr has no file descriptor: in-process tests)
        with contextlib.suppress(OSError, ValueError):
            faulthandler.enable()
    args = build_parser().parse_args(argv)
    fmt = args.log_format
    quiet = args.command == "demo"
    logs.configure(
        level="warning" if quiet and args.log_level == "info" else args.log_level,
        json=None if fmt == "auto" else fmt == "json",
    )
    try:
        rc: int = args.func(args)
    except BrokenPipeError:
        # The reader went away (`watchd scan | head -3`): what it did not read is not an
        # error of ours and no traceback; stdout goes to /dev/null so the interpreter's
        # final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return rc
