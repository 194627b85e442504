"""``watchd sim``: the Coder simulator alone, until SIGTERM or SIGINT.

Prints one JSON line (its URL, era and the identities' tokens; with ``--tls`` the CA
file a client must trust) once it listens, so that a script or a test can point a daemon
at it. The certificates of ``--tls`` live in a temporary folder removed at stop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from watchd.sim import certs
from watchd.sim.scenarios import SCENARIOS, bulk
from watchd.sim.server import SimServer
from watchd.sim.state import SimState


def main(args: argparse.Namespace) -> int:
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
        made = certs.make(Path(folder)) if folder else None
        tls = made.server_context() if made else None
        url = await server.start(host or "127.0.0.1", int(port or 0), tls=tls)
        # Handlers before the announcement: whoever reads it may signal at once.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        info: dict[str, Any] = {
            "url": url,
            "era": args.era,
            "identities": [
                {"name": i.name, "username": i.username, "token": i.token} for i in identities
            ],
        }
        if made:
            info["ca_file"] = str(made.ca_file)
        print(json.dumps(info), flush=True)
        await stop.wait()
        await server.stop()
        return 0

    folder = tempfile.mkdtemp(prefix="watchd-sim-tls-") if args.tls else ""
    try:
        return asyncio.run(main())
    except certs.CertError as exc:
        print(f"watchd sim: {exc}", file=sys.stderr)
        return 2
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
