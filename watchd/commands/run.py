"""``watchd run``: the daemon in the foreground until SIGTERM or SIGINT; SIGHUP reloads
(as ``POST /-/reload`` does).

Exits 2 before starting when the config, a secret or a preflight check fails
(README's command table), 0 after a clean shutdown, 1 when the ordered shutdown
outlives :data:`HARD_EXIT_AFTER`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import sys
import threading

from watchd.commands.configuring import config_path, load_or_report, preflight
from watchd.kits import logs

# SIGTERM must end the process well inside Kubernetes' and systemd's grace period;
# if the ordered shutdown hangs past this, the process exits hard.
HARD_EXIT_AFTER = 9.0


def _hard_exit_timer() -> None:
    def bail() -> None:
        sys.stderr.write("watchd: shutdown exceeded its deadline; exiting hard\n")
        sys.stderr.flush()
        os._exit(1)

    timer = threading.Timer(HARD_EXIT_AFTER, bail)
    timer.daemon = True
    timer.start()


def main(args: argparse.Namespace) -> int:
    from watchd.daemon.app import Daemon
    from watchd.daemon.inbound import inbound_cap, raise_fd_limit
    from watchd.daemon.preflight import StartupError
    from watchd.daemon.reloading import Outcome

    path = config_path(args.config)
    loaded = load_or_report(args)
    if loaded is None:
        return 2
    config, secrets = loaded
    problems = preflight(config)
    if problems:
        for p in problems:
            print(f"watchd: cannot start: {p}", file=sys.stderr)
        return 2
    # Every socket and file shares RLIMIT_NOFILE; systemd's default soft limit (1 024)
    # is far below its hard one (docs/limits.md).
    before, soft = raise_fd_limit()
    logs.get("watchd").info(
        "process.fd_limit",
        soft=soft,
        raised_from=before if before != soft else None,
        inbound_connections=inbound_cap(soft, len(config.identities)),
    )

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
        reloading: set[asyncio.Task[Outcome]] = set()

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
