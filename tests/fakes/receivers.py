"""Small servers that speak the receivers' real protocols and validate payloads.

They answer with the documented errors on demand, so the notifiers' error
handling is tested against the contract, not against our own assumptions.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

SLACK_PATH = "/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXXXXXX"


@dataclass
class Scripted:
    """Answers to give before behaving normally: (status, body, headers)."""

    answers: list[tuple[int, str, dict[str, str]]] = field(default_factory=list)
    down: bool = False
    delay: float = 0.0  # seconds before answering (a slow receiver)

    def next(self) -> tuple[int, str, dict[str, str]] | None:
        if self.down:
            return (503, "service unavailable", {})
        return self.answers.pop(0) if self.answers else None


class FakeServer:
    def __init__(self) -> None:
        # Handlers run to completion even when the client goes away (like a real provider).
        self.app = web.Application(handler_args={"handler_cancellation": False})
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.script = Scripted()
        self.received: list[Any] = []
        self.rejected: list[str] = []
        self.arrived = asyncio.Event()

    async def start(self) -> FakeServer:
        self.runner = web.AppRunner(self.app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self.runner:
            await self.runner.cleanup()


class FakeSlack(FakeServer):
    """An incoming webhook: `ok` on success, Slack's error strings otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.app.router.add_post(SLACK_PATH, self.hook)
        self.app.router.add_post("/{tail:.*}", self.no_service)

    @property
    def webhook_url(self) -> str:
        return self.url + SLACK_PATH

    async def no_service(self, request: web.Request) -> web.Response:
        return web.Response(status=404, text="no_service")

    async def hook(self, request: web.Request) -> web.Response:
        scripted = self.script.next()
        if scripted is not None:
            status, body, headers = scripted
            return web.Response(status=status, text=body, headers=headers)
        if request.content_type != "application/json":
            return web.Response(status=400, text="invalid_payload")
        try:
            msg = await request.json()
        except ValueError:
            return web.Response(status=400, text="invalid_payload")
        problem = self.validate(msg)
        if problem:
            self.rejected.append(problem)
            return web.Response(status=400, text=problem)
        self.received.append(msg)
        self.arrived.set()
        return web.Response(text="ok")

    @staticmethod
    def validate(msg: Any) -> str:
        if not isinstance(msg, dict):
            return "invalid_payload"
        blocks = msg.get("blocks")
        if not msg.get("text") and not blocks:
            return "no_text"
        if blocks is not None:
            if not isinstance(blocks, list) or len(blocks) > 50:
                return "invalid_blocks"
            for b in blocks:
                if b.get("type") == "header":
                    t = b["text"]
                    if t.get("type") != "plain_text" or len(t.get("text", "")) > 150:
                        return "invalid_blocks"
                elif b.get("type") == "section":
                    text = b["text"]["text"]
                    if len(text) > 3000:
                        return "invalid_blocks"
                elif b.get("type") == "context":
                    if not b.get("elements"):
                        return "invalid_blocks"
                else:
                    return "invalid_blocks"
        for text in FakeSlack.texts(msg):
            # Slack control sequences: only <!…>, <@…>, <#…> and <url|text> may appear raw.
            for m in re.finditer(r"<([^>]*)>", text):
                inner = m.group(1)
                if inner.startswith(("!", "@", "#")):
                    return "invalid_payload: unescaped control sequence"
        return ""

    @staticmethod
    def texts(msg: dict[str, Any]) -> list[str]:
        out = [msg.get("text", "")]
        for b in msg.get("blocks") or []:
            if "text" in b:
                out.append(b["text"]["text"])
            for e in b.get("elements", []):
                out.append(e.get("text", ""))
        return out


class FakePagerDuty(FakeServer):
    """Events API v2 at /v2/enqueue, with incidents tracked by dedup_key."""

    def __init__(self) -> None:
        super().__init__()
        self.app.router.add_post("/v2/enqueue", self.enqueue)
        self.open: dict[str, dict[str, Any]] = {}
        self.pages = 0  # incidents opened (a trigger on a key that was not open)
        self.resolves = 0

    @property
    def events_url(self) -> str:
        return self.url + "/v2/enqueue"

    async def enqueue(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if self.script.delay:
            # Accepted on the provider's side, answered slowly (the client may be gone).
            await asyncio.sleep(self.script.delay)
        scripted = self.script.next()
        if scripted is not None:
            status, body, headers = scripted
            return web.Response(status=status, text=body, headers=headers)
        if len(raw) > 512 * 1024:
            return web.json_response(
                {"status": "invalid event", "message": "Event too large"}, status=400
            )
        try:
            ev = json.loads(raw)
        except ValueError:
            return web.json_response(
                {"status": "invalid event", "message": "Event object is invalid"}, status=400
            )
        errors = self.validate(ev)
        if errors:
            self.rejected.append("; ".join(errors))
            return web.json_response(
                {"status": "invalid event", "message": "Event object is invalid", "errors": errors},
                status=400,
            )
        self.received.append(ev)
        key = ev["dedup_key"]
        if ev["event_action"] == "trigger":
            if key not in self.open:
                self.pages += 1
            self.open[key] = ev
        elif ev["event_action"] == "resolve" and key in self.open:
            del self.open[key]
            self.resolves += 1
        self.arrived.set()
        return web.json_response(
            {"status": "success", "message": "Event processed", "dedup_key": key}, status=202
        )

    @staticmethod
    def validate(ev: Any) -> list[str]:
        errors = []
        if not isinstance(ev, dict):
            return ["event must be an object"]
        if not re.fullmatch(r"[A-Za-z0-9]{32}", str(ev.get("routing_key", ""))):
            errors.append("'routing_key' must be 32 characters")
        action = ev.get("event_action")
        if action not in ("trigger", "acknowledge", "resolve"):
            errors.append("'event_action' is invalid")
        key = ev.get("dedup_key")
        if key is not None and (not isinstance(key, str) or len(key) > 255):
            errors.append("'dedup_key' must be a string of at most 255 characters")
        if action in ("acknowledge", "resolve") and not key:
            errors.append("'dedup_key' is required to acknowledge or resolve")
        if action == "trigger":
            p = ev.get("payload")
            if not isinstance(p, dict):
                return [*errors, "'payload' is missing"]
            if not p.get("summary") or len(p["summary"]) > 1024:
                errors.append("'payload.summary' is missing or longer than 1024")
            if not p.get("source"):
                errors.append("'payload.source' is missing")
            if p.get("severity") not in ("critical", "error", "warning", "info"):
                errors.append("'payload.severity' is invalid")
            for link in ev.get("links", []):
                if "href" not in link:
                    errors.append("'links' entries need href")
        return errors


class FakeWebhook(FakeServer):
    """Any Alertmanager webhook consumer: records bodies and headers."""

    def __init__(self, path: str = "/alerts") -> None:
        super().__init__()
        self.app.router.add_post(path, self.hook)
        self.path = path
        self.headers: list[dict[str, str]] = []
        self.raw: list[bytes] = []

    @property
    def hook_url(self) -> str:
        return self.url + self.path

    async def hook(self, request: web.Request) -> web.Response:
        scripted = self.script.next()
        if scripted is not None:
            status, body, headers = scripted
            return web.Response(status=status, text=body, headers=headers)
        raw = await request.read()
        self.raw.append(raw)
        self.headers.append(dict(request.headers))
        self.received.append(json.loads(raw))
        self.arrived.set()
        return web.Response(text="")
