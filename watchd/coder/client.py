"""The Coder chats REST client: prefix probing, listing, single reads, mutations.

Prefix drift (``/api/v2`` vs ``/api/experimental``) is handled here: the
working prefix is probed once and cached, and a 404 on a route we know
exists triggers one re-probe (the server may have been upgraded). Retryable
failures are retried with jittered backoff whose floor is the server's hint,
bounded by a deadline so no caller waits forever.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

from watchd.coder.backoff import Backoff
from watchd.coder.errors import CoderError, PayloadError
from watchd.coder.models import (
    Chat,
    Quota,
    User,
    WorkspaceBuild,
    flatten,
    parse_chat,
    parse_quota,
    parse_user,
    parse_workspace_build,
)
from watchd.coder.transport import Response, Transport

PREFIXES = ("/api/v2", "/api/experimental")
PAGE_LIMIT = 100
# No deployment holds a million chats per user; a listing that pages on past
# this is a server looping on its cursor, and we stop rather than spin.
MAX_PAGES = 10_000
# Without any hint, Coder's rate-limit window is one minute.
DEFAULT_429_WAIT = 60.0


class CoderClient:
    """Chats API for one identity on one deployment."""

    def __init__(
        self,
        transport: Transport,
        *,
        attempts: int = 4,
        deadline: float = 90.0,
        rng: random.Random | None = None,
        prefix: str | None = None,
    ) -> None:
        self.transport = transport
        self.attempts = attempts
        self.deadline = deadline
        self._rng = rng or random.Random()
        self._prefix: str | None = prefix
        self._probe_lock = asyncio.Lock()
        self.relists = 0

    @property
    def prefix(self) -> str | None:
        return self._prefix

    # -- plumbing -----------------------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        *,
        params: list[tuple[str, str]] | None = None,
        json_body: Any = None,
        retry: bool = True,
    ) -> Response:
        backoff = Backoff(base=0.5, cap=20.0, rng=self._rng)
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.deadline
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self.transport.request(
                    method, path, params=params, json_body=json_body
                )
            except CoderError as exc:
                if not retry or not exc.retryable or attempt >= self.attempts:
                    raise
                delay = backoff.next()
                if exc.retry_after is not None:
                    delay = max(delay, exc.retry_after)
                elif exc.status == 429:
                    delay = max(delay, DEFAULT_429_WAIT)
                if loop.time() + delay > give_up_at:
                    raise
                await asyncio.sleep(delay)

    async def resolve_prefix(self, *, force: bool = False) -> str:
        """The API prefix that serves chats on this deployment (cached)."""
        async with self._probe_lock:
            if self._prefix is not None and not force:
                return self._prefix
            last: CoderError | None = None
            for prefix in PREFIXES:
                try:
                    await self._call("GET", f"{prefix}/chats", params=[("limit", "1")])
                except CoderError as exc:
                    if exc.status == 404:
                        last = exc
                        continue
                    raise
                self._prefix = prefix
                return prefix
            assert last is not None
            raise CoderError(
                status=404,
                message="no chats API on this deployment (tried /api/v2 and /api/experimental)",
                method="GET",
                path="/chats",
            )

    async def _chat_call(
        self,
        method: str,
        suffix: str,
        *,
        params: list[tuple[str, str]] | None = None,
        json_body: Any = None,
        retry: bool = True,
    ) -> Response:
        """A call under the chats prefix; a 404 re-probes once in case the server moved."""
        prefix = await self.resolve_prefix()
        try:
            return await self._call(
                method, prefix + suffix, params=params, json_body=json_body, retry=retry
            )
        except CoderError as exc:
            if exc.status != 404:
                raise
            fresh = await self.resolve_prefix(force=True)
            if fresh == prefix:
                raise
            return await self._call(
                method, fresh + suffix, params=params, json_body=json_body, retry=retry
            )

    # -- chats --------------------------------------------------------------------

    async def list_chats(
        self, *, archived: bool = False, labels: dict[str, str] | None = None
    ) -> list[Chat]:
        """Every chat this token owns (roots and their children, flattened, each once;
        a row repeated by paging keeps its position and its latest content)."""
        latest: dict[str, Chat] = {}
        async for rows in self.chat_rows(archived=archived, labels=labels):
            roots = [parse_chat(row, where=f"chats[{i}]") for i, row in enumerate(rows)]
            for chat in flatten(roots):
                latest[chat.id] = chat
        return list(latest.values())

    async def chat_rows(
        self, *, archived: bool = False, labels: dict[str, str] | None = None
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """The listing one page at a time, as decoded rows (parse them with
        :func:`parse_chat`): a caller that already knows most rows need not parse them.

        Keyset pagination with ``after_id``; rows bumped mid-sweep can repeat and are
        yielded again (the later copy is the newer one). Stops at a short page, or at a
        page with nothing new (a server that ignores the cursor).
        """
        base: list[tuple[str, str]] = [("limit", str(PAGE_LIMIT))]
        if archived:
            base.append(("q", "archived:true"))
        for key, value in sorted((labels or {}).items()):
            base.append(("label", f"{key}:{value}"))
        seen: set[str] = set()
        after: str | None = None
        for _page in range(MAX_PAGES):
            params = list(base)
            if after:
                params.append(("after_id", after))
            resp = await self._chat_call("GET", "/chats", params=params)
            rows = resp.json()
            if not isinstance(rows, list):
                raise PayloadError("chats", f"expected a JSON array, got {type(rows).__name__}")
            fresh = 0
            last: str | None = None
            for i, row in enumerate(rows):
                chat_id = row.get("id") if isinstance(row, dict) else None
                if not isinstance(chat_id, str) or not chat_id:
                    parse_chat(row, where=f"chats[{i}]")  # raises, naming what is wrong
                    raise PayloadError(f"chats[{i}].id", "missing or not a string")
                if chat_id not in seen:
                    fresh += 1
                    seen.add(chat_id)
                last = chat_id
            yield rows
            if len(rows) < PAGE_LIMIT or fresh == 0 or last is None:
                break
            after = last
        self.relists += 1

    async def get_chat(self, chat_id: str) -> Chat:
        resp = await self._chat_call("GET", f"/chats/{chat_id}")
        return parse_chat(resp.json())

    async def interrupt(self, chat_id: str) -> Chat | None:
        """Ask the run to stop. Asynchronous: the answer is usually ``interrupting``
        (newest) or ``waiting`` (older eras). Never retried blindly: 409 is an answer."""
        resp = await self._chat_call("POST", f"/chats/{chat_id}/interrupt", retry=False)
        body = resp.json()
        return parse_chat(body) if isinstance(body, dict) else None

    async def archive(self, chat_id: str) -> None:
        """Archive a root chat (cascades to children). Era A uses ``POST …/archive``."""
        prefix = await self.resolve_prefix()
        try:
            await self._chat_call(
                "PATCH", f"/chats/{chat_id}", json_body={"archived": True}, retry=False
            )
        except CoderError as exc:
            if exc.status in (404, 405) and prefix == "/api/experimental":
                await self._call("POST", f"{prefix}/chats/{chat_id}/archive", retry=False)
                return
            raise

    # -- identity and quota -------------------------------------------------------

    async def me(self) -> User:
        return parse_user((await self._call("GET", "/api/v2/users/me")).json())

    async def organizations(self) -> list[dict[str, Any]]:
        body = (await self._call("GET", "/api/v2/users/me/organizations")).json()
        if not isinstance(body, list):
            raise PayloadError("organizations", "expected a JSON array")
        return [o for o in body if isinstance(o, dict)]

    async def workspace_quota(self, org: str, user: str = "me") -> Quota | None:
        """The user's quota in an org, or None where the route does not exist (OSS)."""
        try:
            resp = await self._call(
                "GET", f"/api/v2/organizations/{org}/members/{user}/workspace-quota"
            )
        except CoderError as exc:
            if exc.status == 404:
                return None
            raise
        return parse_quota(resp.json())

    async def workspace(self, workspace_id: str) -> WorkspaceBuild:
        return parse_workspace_build(
            (await self._call("GET", f"/api/v2/workspaces/{workspace_id}")).json()
        )
