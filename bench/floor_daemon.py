"""The least a daemon doing watchd's job with watchd's declared stack does: the footprint
rows' strongest floor.

``python -m bench.floor_daemon URL TOKEN PORT``: import what ``watchd run`` must import
(aiohttp client and server, pydantic, PyYAML, structlog, prometheus-client, orjson,
msgspec), list the identity's chats once (keyset pages of 500, decoded with orjson), open
its watch socket, then answer ``GET /readyz`` with 200 and decode whatever the socket
sends. No configuration, validation, store, detection, alerting or state: everything
watchd adds above this is what its own rows cost beyond the floor.

``python -m bench.floor_daemon --config FILE``: the same, with URL, token and port read
from a YAML file and validated by a three-field pydantic model — the least a daemon that
validates its configuration with this stack's validator does. Importing ``pydantic`` is
lazy (it loads almost nothing); the first model class loads its schema machinery, which
is what this mode adds to the floor.
"""

from __future__ import annotations

import asyncio
import sys

import aiohttp
import msgspec  # noqa: F401  (imported, as watchd run must)
import orjson
import prometheus_client  # noqa: F401
import pydantic
import structlog  # noqa: F401
import yaml
from aiohttp import web


async def main(url: str, token: str, port: int) -> None:
    ready = asyncio.Event()

    async def readyz(request: web.Request) -> web.Response:
        return web.json_response({"ready": ready.is_set()}, status=200 if ready.is_set() else 503)

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    async with aiohttp.ClientSession(headers={"Coder-Session-Token": token}) as session:
        after = ""
        while True:
            query = "limit=500" + (f"&after_id={after}" if after else "")
            async with session.get(f"{url}/api/v2/chats?{query}") as r:
                rows = orjson.loads(await r.read())
            if len(rows) < 500:
                break
            after = rows[-1]["id"]
        async with session.ws_connect(f"{url}/api/v2/chats/watch") as ws:
            ready.set()
            async for msg in ws:
                if msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    orjson.loads(msg.data)


def configured(path: str) -> tuple[str, str, int]:
    """URL, token and port from a YAML file, validated as a pydantic-configured daemon
    does (the model is built here, so the plain mode never loads pydantic's machinery)."""

    class FloorConfig(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        url: pydantic.AnyHttpUrl
        token: str = pydantic.Field(min_length=1)
        port: int = pydantic.Field(ge=1, le=65535)

    with open(path) as f:
        config = FloorConfig.model_validate(yaml.safe_load(f))
    return str(config.url).rstrip("/"), config.token, config.port


if __name__ == "__main__":
    if sys.argv[1] == "--config":
        asyncio.run(main(*configured(sys.argv[2])))
    else:
        asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
