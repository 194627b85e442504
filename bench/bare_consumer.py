"""Baseline for watch throughput: a bare aiohttp consumer that only decodes frames
(with orjson, the decoder the daemon uses).

Usage: python -m bench.bare_consumer URL EXPECTED TOKEN [TOKEN ...]
Prints "ready" once every socket is open and "done" when EXPECTED frames were decoded.
"""

from __future__ import annotations

import asyncio
import sys

import aiohttp
import orjson


async def main(url: str, expected: int, tokens: list[str]) -> None:
    count = 0
    done = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        sockets = [
            await session.ws_connect(
                url + "/api/v2/chats/watch", headers={"Coder-Session-Token": t}, heartbeat=20
            )
            for t in tokens
        ]
        print("ready", flush=True)

        async def read(ws: aiohttp.ClientWebSocketResponse) -> None:
            nonlocal count
            async for msg in ws:
                orjson.loads(msg.data)
                count += 1
                if count >= expected:
                    done.set()

        tasks = [asyncio.create_task(read(ws)) for ws in sockets]
        await done.wait()
        print("done", count, flush=True)
        for t in tasks:
            t.cancel()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:]))
