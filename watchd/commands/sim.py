"""``watchd sim``: the Coder simulator alone, until SIGTERM or SIGINT.

Prints one JSON line (its URL, era and the identities' tokens) once it listens,
so that a script or a test can point a daemon at it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal

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
