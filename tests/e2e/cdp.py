"""A few Chrome DevTools Protocol calls over aiohttp's WebSocket client: enough to load a
page in headless Chromium at a given screen size and ask the rendered page (computed
styles, what is visible) what a person sees, and to keep a screenshot."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from tests.e2e.harness import free_port


class Page:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        n = next(self._ids)
        await self.ws.send_json({"id": n, "method": method, "params": params})
        while True:
            msg = json.loads((await self.ws.receive(timeout=30)).data)
            if msg.get("id") == n:
                assert "error" not in msg, msg
                return dict(msg.get("result", {}))

    async def open(self, url: str, *, width: int, height: int, mobile: bool = False) -> None:
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width, height=height, deviceScaleFactor=1, mobile=mobile,
        )  # fmt: skip
        await self.call("Page.enable")
        await self.call("Page.navigate", url=url)
        for _ in range(100):
            state = await self.eval("document.readyState")
            if state == "complete":
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"{url} did not load")

    async def eval(self, expression: str) -> Any:
        got = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return got["result"].get("value")

    async def screenshot(self, path: Path) -> None:
        got = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        await asyncio.to_thread(path.write_bytes, base64.b64decode(got["data"]))


@contextlib.asynccontextmanager
async def chromium(tmp: Path) -> AsyncIterator[Page]:
    binary = shutil.which("chromium")
    assert binary, "run tests/setup/system-deps (make test does)"
    port = free_port()
    proc = subprocess.Popen(  # noqa: ASYNC220 (started once; it is waited for below)
        [
            binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp / 'cdp-profile'}", f"--remote-debugging-port={port}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as s:
            targets: list[dict[str, Any]] = []
            for _ in range(100):
                with contextlib.suppress(aiohttp.ClientError):
                    async with s.get(f"http://127.0.0.1:{port}/json") as r:
                        targets = [t for t in await r.json() if t.get("type") == "page"]
                if targets:
                    break
                await asyncio.sleep(0.1)
            assert targets, "chromium's DevTools endpoint never answered"
            async with s.ws_connect(targets[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                yield Page(ws)
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
