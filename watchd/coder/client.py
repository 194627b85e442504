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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from msgspec.structs import replace

from watchd.coder.errors import CoderError, PayloadError
from watchd.coder.models import (
    ChatCost,
    User,
    WorkspaceBuild,
    parse_chat_cost,
    parse_quota,
    parse_user,
    parse_workspace_build,
)
from watchd.coder.observing import Observation, Quota, flatten, from_json
from watchd.coder.pages import ListingPage, read_page
from watchd.coder.routes import PREFIXES
from watchd.coder.transport import MAX_BODY, Response, Transport
from watchd.kits.backoff import Backoff

# coderd has no page-size maximum (``ParsePagination`` checks only for a non-negative
# int32); big pages cut requests and shorten the window in which the moving cursor can
# skip a row. See docs/coder-api.md.
DEFAULT_PAGE_SIZE = 500
# A listing that pages on past this is a server looping on its cursor (or inventing
# rows): we stop rather than spin, and the listing counts as incomplete.
MAX_PAGES = 2_000
# A listing page may be this large per row asked for (subagents ride inside their root).
PAGE_BYTES_PER_ROW = 64 * 1024
MIN_PAGE_BYTES = 8 * 1024 * 1024
# An empty page right after a full one may mean the cursor chat was deleted mid-sweep
# (coderd's comparison with a missing row is NULL): retry from this many earlier rows.
CURSOR_WALKBACK = 3
# Without any hint, Coder's rate-limit window is one minute.
DEFAULT_429_WAIT = 60.0
# A chat tree's cost is four numbers and an id (about 150 bytes): a bigger answer is not one.
COST_BODY = 4096


@dataclass(slots=True)
class Listing:
    """What one paged listing proved. Only a ``complete`` listing is evidence that a
    chat it lacks *might* be gone (and even then only after confirmation: coderd's
    keyset cursor skips rows that move while the client pages)."""

    pages: int = 0
    rows: int = 0
    complete: bool = False
    # Why the listing cannot be trusted for absence (empty when complete).
    incomplete: str = ""


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
        page_size: int = DEFAULT_PAGE_SIZE,
        on_refused: Callable[[CoderError], None] | None = None,
    ) -> None:
        self.transport = transport
        self.attempts = attempts
        self.deadline = deadline
        self.page_size = page_size
        # Told about every 401/403 on any call: a revoked token shows up on whichever
        # request comes first (coderd never re-checks an open watch socket).
        self.on_refused = on_refused
        self._rng = rng or random.Random()
        self._prefix: str | None = prefix
        self._probe_lock = asyncio.Lock()
        self.relists = 0
        self.incomplete_listings = 0

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
        max_body: int = MAX_BODY,
    ) -> Response:
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.deadline
        backoff: Backoff | None = None
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self.transport.request(
                    method, path, params=params, json_body=json_body, max_body=max_body
                )
            except CoderError as exc:
                if exc.is_auth and self.on_refused is not None:
                    self.on_refused(exc)
                if not retry or not exc.retryable or attempt >= self.attempts:
                    raise
                if backoff is None:  # most calls never retry
                    backoff = Backoff(base=0.5, cap=20.0, rng=self._rng)
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
        if not force and self._prefix is not None and not self._probe_lock.locked():
            return self._prefix  # what taking the free lock would answer at once
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
        max_body: int = MAX_BODY,
    ) -> Response:
        """A call under the chats prefix; a 404 re-probes once in case the server moved."""
        prefix = await self.resolve_prefix()
        try:
            return await self._call(
                method,
                prefix + suffix,
                params=params,
                json_body=json_body,
                retry=retry,
                max_body=max_body,
            )
        except CoderError as exc:
            if exc.status != 404:
                raise
            fresh = await self.resolve_prefix(force=True)
            if fresh == prefix:
                raise
            return await self._call(
                method,
                fresh + suffix,
                params=params,
                json_body=json_body,
                retry=retry,
                max_body=max_body,
            )

    # -- chats --------------------------------------------------------------------

    async def list_chats(
        self,
        *,
        archived: bool = False,
        labels: dict[str, str] | None = None,
        listing: Listing | None = None,
    ) -> list[Observation]:
        """Every chat this token owns (roots and their children, flattened, each once;
        a row repeated by paging keeps its position and its latest content)."""
        latest: dict[str, Observation] = {}
        async for rows in self.chat_rows(archived=archived, labels=labels, listing=listing):
            roots = [from_json(row, where=f"chats[{i}]") for i, row in enumerate(rows)]
            for chat in flatten(roots):
                latest[chat.id] = chat
        return list(latest.values())

    async def chat_rows(
        self,
        *,
        archived: bool = False,
        labels: dict[str, str] | None = None,
        listing: Listing | None = None,
    ) -> AsyncIterator[list[Any]]:
        """The listing one page at a time, as decoded rows (parse them with
        :func:`~watchd.coder.observing.from_json`); paged as :meth:`chat_pages` pages."""
        async for page in self.chat_pages(
            archived=archived, labels=labels, listing=listing, compared=False
        ):
            yield page.full()

    async def chat_pages(
        self,
        *,
        archived: bool = False,
        labels: dict[str, str] | None = None,
        listing: Listing | None = None,
        compared: bool = True,
    ) -> AsyncIterator[ListingPage]:
        """The listing one page at a time, each row decoded only as far as telling
        whether it is news needs (:class:`ListingPage`): a caller that already knows
        most rows need not decode them in full (one that knows none, e.g. seeding an
        empty store, passes ``compared=False`` and has every page decoded in full).

        Keyset pagination with ``after_id``; rows bumped mid-sweep can repeat and are
        yielded again (the later copy is the newer one). ``listing`` (if given) is told
        whether the sweep completed: it ends at a short page, or at an empty page after
        a full one once an earlier cursor finds nothing new (the cursor chat may have
        been deleted). A full page of rows already seen, a cursor that does not move, or
        a sweep past MAX_PAGES ends it *incomplete*: nothing may be inferred from what
        it lacks.
        """
        lst = listing if listing is not None else Listing()
        limit = self.page_size
        base: list[tuple[str, str]] = [("limit", str(limit))]
        if archived:
            base.append(("q", "archived:true"))
        for key, value in sorted((labels or {}).items()):
            base.append(("label", f"{key}:{value}"))
        seen: set[str] = set()
        after: str | None = None
        # Ids of the previous full page, newest cursor candidates last.
        previous: list[str] = []
        walked = 0
        while True:
            if lst.pages >= MAX_PAGES:
                lst.incomplete = f"stopped after {MAX_PAGES} pages (a looping cursor?)"
                break
            params = list(base)
            if after:
                params.append(("after_id", after))
            resp = await self._chat_call(
                "GET",
                "/chats",
                params=params,
                max_body=max(MIN_PAGE_BYTES, limit * PAGE_BYTES_PER_ROW),
            )
            page = read_page(resp.body, compared=compared)
            ids = page.ids
            lst.pages += 1
            lst.rows += len(ids)
            # Distinct ids this listing had not read yet (a repeat within a page counts once).
            known = len(seen)
            seen.update(ids)
            fresh = len(seen) - known
            if ids:
                yield page
            if not ids and previous and walked < min(CURSOR_WALKBACK, len(previous) - 1):
                # Empty after a full page: step the cursor back one row and ask again.
                walked += 1
                after = previous[-1 - walked]
                continue
            if len(ids) < limit:
                if ids and fresh == 0 and walked == 0 and after is not None:
                    lst.incomplete = "a short page held only rows already seen"
                    break
                lst.complete = True
                break
            if fresh == 0:
                lst.incomplete = "a full page held only rows already seen (cursor ignored?)"
                break
            if ids[-1] == after:
                lst.incomplete = "the cursor did not move"
                break
            previous, walked = ids, 0
            after = ids[-1]
        if not lst.complete:
            self.incomplete_listings += 1
        self.relists += 1

    async def get_chat(self, chat_id: str) -> Observation:
        """One chat, authoritative. On a single GET coderd omits ``queued_for_capacity``
        when it is false (``bool,omitempty``), so absent here means false."""
        resp = await self._chat_call("GET", f"/chats/{chat_id}")
        chat = from_json(resp.json())
        if chat.queued_for_capacity is None:
            chat = replace(chat, queued_for_capacity=False)
        return chat

    async def chat_cost(self, chat_id: str) -> ChatCost:
        """``GET …/chats/{chat}/cost`` (v2.37 on): the spend of the chat's tree as coderd
        resolves it (its ``root_chat_id``, else its parent, else the chat). One attempt,
        a small body at most (COST_BODY): a monitor's read, never pressed. A 404 (a chat
        gone, or a server before the route) does not re-probe the prefix."""
        prefix = await self.resolve_prefix()
        path = f"{prefix}/chats/{chat_id}/cost"
        resp = await self._call("GET", path, retry=False, max_body=COST_BODY)
        return parse_chat_cost(resp.json())

    async def reconcile_invalid(self, chat_id: str) -> Observation | None:
        """``POST …/reconcile-invalid`` (newest servers): move a chat whose execution state
        is invalid to ``error``. A 404 on a chat we can read means this server lacks the
        route. Never retried blindly."""
        resp = await self._chat_call("POST", f"/chats/{chat_id}/reconcile-invalid", retry=False)
        body = resp.json()
        return from_json(body) if isinstance(body, dict) else None

    async def interrupt(self, chat_id: str) -> Observation | None:
        """Ask the run to stop. Asynchronous: the answer is usually ``interrupting``
        (newest) or ``waiting`` (older eras). Never retried blindly: 409 is an answer."""
        resp = await self._chat_call("POST", f"/chats/{chat_id}/interrupt", retry=False)
        body = resp.json()
        return from_json(body) if isinstance(body, dict) else None

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
