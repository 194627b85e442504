"""The runtime silences API: ``GET/POST /api/v1/silences``, ``DELETE …/{id}``; and the
admin token's check, which ``POST /-/reload`` shares.

Listing needs the admin token when one is set; changing silences always does
(without a token, silences are read-only and config-defined). A silence added
here is persisted before it is answered, so a restart keeps it; config-defined
silences cannot be expired here (the file is their source of truth).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web
from pydantic import SecretStr

from watchd.alerting.silencing import (
    Silence,
    Silencer,
    SilenceRows,
    from_config,
    new_id,
    silence_from_json,
)
from watchd.config.alerting import SilenceConfig
from watchd.config.fields import parse_duration
from watchd.kits import logs
from watchd.kits.matchers import MatcherError, parse_matchers
from watchd.store.sqlite import StateFile

log = logs.get("watchd.silences")

FIELDS = frozenset({"matchers", "duration", "starts_at", "ends_at", "comment", "created_by"})


class SilenceBook:
    """The silences in force, with every runtime change persisted and logged."""

    def __init__(self, silencer: Silencer, save: Callable[[str, dict[str, Any]], None]) -> None:
        self.silencer = silencer
        self._save = save

    @classmethod
    def open(cls, configured: Iterable[SilenceConfig], db: StateFile) -> SilenceBook:
        """The config's silences and the runtime ones kept in the state file."""
        stored = db.part(SilenceRows)
        silencer = Silencer(
            [
                *from_config(configured, now=time.time()),
                *(silence_from_json(b) for b in stored.load()),
            ]
        )
        return cls(silencer, stored.save)

    def add(self, silence: Silence) -> None:
        self.silencer.add(silence)
        self._save(silence.id, silence.to_json(time.time()))
        log.info(
            "silence.added",
            id=silence.id,
            matchers=[str(m) for m in silence.matchers],
            ends_at=silence.ends_at,
            created_by=silence.created_by,
        )

    def expire(self, silence_id: str) -> Silence | None:
        """End a runtime silence now; None when there is none (or it is config-defined)."""
        existing = self.silencer.silences.get(silence_id)
        if existing is None or existing.source == "config":
            return None
        ended = self.silencer.expire(silence_id, now=time.time())
        if ended is not None:
            self._save(ended.id, ended.to_json(time.time()))
            log.info("silence.expired", id=silence_id)
        return ended


def parse_silence(body: object, now: float) -> Silence:
    """A new silence from a POST body; ValueError naming what was wrong."""
    if not isinstance(body, dict):
        raise ValueError("body: expected an object")
    unknown = set(body) - FIELDS
    if unknown:
        raise ValueError(f"unknown fields: {sorted(unknown)}")
    try:
        raw = body.get("matchers")
        if not isinstance(raw, list) or not raw or not all(isinstance(m, str) for m in raw):
            raise ValueError("matchers: a non-empty list of matcher strings is required")
        matchers = parse_matchers(raw)
        starts = float(body.get("starts_at", now))
        if "ends_at" in body:
            ends = float(body["ends_at"])
        elif "duration" in body:
            ends = starts + parse_duration(body["duration"])
        else:
            raise ValueError("give duration (e.g. 2h) or ends_at (epoch seconds)")
        if ends <= starts:
            raise ValueError("the silence ends before it starts")
    except (MatcherError, TypeError) as exc:
        raise ValueError(str(exc)) from None
    return Silence(
        id=new_id(),
        matchers=matchers,
        starts_at=starts,
        ends_at=ends,
        comment=str(body.get("comment", ""))[:500],
        created_by=str(body.get("created_by", "api"))[:100],
    )


class AdminToken:
    """The admin bearer token in force (read on each check: a reload may change it)."""

    def __init__(self, token: Callable[[], SecretStr | None]) -> None:
        self._token = token

    def refusal(self, request: web.Request, *, off: str | None) -> web.Response | None:
        """None when the request may go on. 401 unless it bears the token; with no token
        configured, 403 saying ``off`` (or None when ``off`` is None: open to reading)."""
        token = self._token()
        if token is None:
            if off is None:
                return None
            return web.json_response({"error": off}, status=403)
        given = request.headers.get("Authorization", "")
        expected = f"Bearer {token.get_secret_value()}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return web.json_response(
                {"error": "missing or wrong bearer token"},
                status=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return None


READ_ONLY = (
    "silences are read-only: set server.admin_token_file (or _env, _credential) to manage "
    "them at runtime"
)


class SilencesApi:
    """The handlers, bound to a book and to the admin token in force."""

    def __init__(self, book: SilenceBook, admin: AdminToken) -> None:
        self.book = book
        self.admin = admin

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/api/v1/silences", self.list)
        app.router.add_post("/api/v1/silences", self.add)
        app.router.add_delete("/api/v1/silences/{id}", self.expire)

    def _authorized(self, request: web.Request, *, mutate: bool) -> web.Response | None:
        return self.admin.refusal(request, off=READ_ONLY if mutate else None)

    async def list(self, request: web.Request) -> web.Response:
        denied = self._authorized(request, mutate=False)
        if denied is not None:
            return denied
        now = time.time()
        items = [s.to_json(now) for s in self.book.silencer.silences.values()]
        return web.json_response({"silences": sorted(items, key=lambda s: str(s["id"]))})

    async def add(self, request: web.Request) -> web.Response:
        denied = self._authorized(request, mutate=True)
        if denied is not None:
            return denied
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": "body: not JSON"}, status=400)
        now = time.time()
        try:
            silence = parse_silence(body, now)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        self.book.add(silence)
        return web.json_response(silence.to_json(now), status=201)

    async def expire(self, request: web.Request) -> web.Response:
        denied = self._authorized(request, mutate=True)
        if denied is not None:
            return denied
        ended = self.book.expire(request.match_info["id"])
        if ended is None:
            return web.json_response({"error": "no such silence"}, status=404)
        return web.json_response(ended.to_json(time.time()))
