"""``watchd demo``: the simulator and the daemon in one process, narrated.

The simulator runs the ``demo`` scenario (three identities, one with a
revoked token); the daemon watches it with budgets of seconds instead of
minutes, so stuck, stranded and resolved chats all show within a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from typing import TextIO

from watchd.config.loading import parse_config
from watchd.config.model import Config
from watchd.config.secrets import resolve_secrets
from watchd.daemon.app import Daemon
from watchd.daemon.preflight import StartupError, check_listen
from watchd.sim.scenarios import demo as demo_scenario
from watchd.sim.server import SimServer
from watchd.sim.state import SimState
from watchd.watching.settings import WatchSettings

INTRO = """\
watchd demo — a simulated Coder deployment (era E, /api/v2) with three identities:

  team-a  a busy fleet: short turns that finish, one chat wedged in `running` while
          queued for capacity, one slow turn that ends after ~45 s, one that
          finishes *silently* (the stream never says so; the reconcile finds it), and
          a workspace quota that keeps rising (a forecast pages a minute ahead)
  team-b  a client-tool pause stranded in `requires_action`, a chat whose workspace
          build failed for insufficient quota, and a parent with a subagent child
  team-c  a revoked token

Budgets are shortened for the demo: running 20s, requires_action 15s, interrupting
10s; reconcile every 10s; an identity unhealthy for 10s raises IdentityUnhealthy; quota
read every 5s, its forecast fitted over 30s with a 1m horizon.
"""


def demo_config(url: str, state_dir: str, listen: str) -> Config:
    return parse_config(
        {
            "identities": [
                {
                    "name": name,
                    "url": url,
                    "token_env": f"WATCHD_DEMO_TOKEN_{name.upper()[-1]}",
                    "labels": {"team": name[-1]},
                    "unhealthy_after": "10s",
                }
                for name in ("team-a", "team-b", "team-c")
            ],
            "budgets": {
                "running": "20s",
                "requires_action": "15s",
                "interrupting": "10s",
                "pending": "20s",
                "default": "20s",
            },
            "reconcile_interval": "10s",
            "quota": {"interval": "5s"},
            "forecast": {"window": "30s", "horizon": "1m"},
            "route": {"receiver": "console", "group_wait": "1s", "group_interval": "5s"},
            "receivers": [{"name": "console", "console": {}}],
            "server": {"listen": listen},
            "state_dir": state_dir,
        }
    )


async def run_demo(*, duration: float, listen: str, out: TextIO) -> int:
    state = SimState(era="E", seed=7)
    identities = demo_scenario(state)
    sim = SimServer(state)
    url = await sim.start()
    for ident in identities:
        os.environ[f"WATCHD_DEMO_TOKEN_{ident.name.upper()[-1]}"] = ident.token
    print(INTRO, file=out)
    print(f"simulator: {url}    status page: http://{listen}/status", file=out, flush=True)
    with tempfile.TemporaryDirectory(prefix="watchd-demo-") as tmp:
        config = demo_config(url, tmp, listen)
        secrets = resolve_secrets(config)
        daemon = Daemon(
            config,
            secrets,
            stdout=out,
            settings=WatchSettings(reconcile_interval=10.0, healthy_after=5.0, auth_retry=30.0),
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        narrator = asyncio.create_task(_narrate(daemon, out))
        timer = asyncio.create_task(_stop_after(duration, stop)) if duration > 0 else None
        started = time.monotonic()
        try:
            await daemon.run(stop)
        finally:
            narrator.cancel()
            if timer:
                timer.cancel()
            await sim.stop()
        spans = daemon.telemetry.by_name
        if spans:
            top = ", ".join(f"{n} ×{c}" for n, c in spans.most_common(5))
            print(
                f"\nspans from watchd's own traffic: {sum(spans.values())} ({top}); set "
                "OTEL_EXPORTER_OTLP_ENDPOINT to export them.",
                file=out,
                flush=True,
            )
        d = daemon.detector.counters
        print(
            f"\ndemo over after {time.monotonic() - started:.0f}s: {d['fired']} alerts fired, "
            f"{d['resolved']} resolved, {daemon.store.synthesized} transitions found only by "
            f"reconcile, {d['confirm_get']} confirmation reads.",
            file=out,
            flush=True,
        )
    return 0


async def _stop_after(seconds: float, stop: asyncio.Event) -> None:
    await asyncio.sleep(seconds)
    stop.set()


async def _narrate(daemon: Daemon, out: TextIO) -> None:
    seen: dict[str, str] = {}
    synthesized = 0
    while True:
        await asyncio.sleep(0.5)
        for name, h in daemon.health.items():
            if seen.get(name) != h.state:
                seen[name] = h.state
                extra = (
                    f" — {h.last_error}"
                    if h.state not in ("ready", "seeding") and h.last_error
                    else ""
                )
                if h.state == "ready":
                    extra = f" — seeded from a listing of {h.last_list_chats} chats"
                print(
                    f"{time.strftime('%H:%M:%S')} identity {name}: {h.state}{extra}",
                    file=out,
                    flush=True,
                )
        if daemon.store.synthesized > synthesized:
            synthesized = daemon.store.synthesized
            print(
                f"{time.strftime('%H:%M:%S')} reconcile found a transition the stream never "
                f"sent (total {synthesized})",
                file=out,
                flush=True,
            )


def main(args: argparse.Namespace) -> int:
    duration, listen = args.duration, args.listen
    busy = check_listen(listen, setting="--listen")
    if busy:
        print(f"watchd demo: cannot start: {busy}; pick another with --listen", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        try:
            return asyncio.run(run_demo(duration=duration, listen=listen, out=sys.stdout))
        except StartupError as exc:  # taken between the check and the bind
            print(f"watchd demo: cannot start: {exc}", file=sys.stderr)
            return 2
    return 0


__all__ = ["main", "run_demo"]
