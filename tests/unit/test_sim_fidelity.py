"""The simulator behaves like coderd where coderd is awkward. Each test is named after the
coderd function (or query) whose behaviour it pins; docs/coder-api.md cites them."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from typing import Any

import aiohttp
import pytest

from tests.conftest import Sim
from watchd.coder.observing import timestamp
from watchd.sim.records import SimUser, Step, iso

RFC3339NANO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{0,8}[1-9])?(Z|[+-]\d\d:\d\d)$")


async def _get(
    sim: Sim, session: aiohttp.ClientSession, user: SimUser, path: str, **params: str
) -> tuple[int, Any, dict[str, str]]:
    async with session.get(
        sim.url + path, params=params, headers={"Coder-Session-Token": user.token}
    ) as r:
        return r.status, await r.json(), dict(r.headers)


async def _post(
    sim: Sim, session: aiohttp.ClientSession, user: SimUser, path: str, body: Any = None
) -> tuple[int, Any]:
    method = "PATCH" if body is not None else "POST"
    async with session.request(
        method, sim.url + path, json=body, headers={"Coder-Session-Token": user.token}
    ) as r:
        text = await r.text()
        return r.status, json.loads(text) if text else None


def _drain(sim: Sim, user: SimUser) -> list[dict[str, Any]]:
    sub = next(s for s in sim.state.subscribers if s.user_id == user.id)
    out = []
    while not sub.queue.empty():
        item = sub.queue.get_nowait()
        if item is not None:
            out.append(item)
    return out


async def test_GetChats_after_id_compares_the_cursor_chats_current_position(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """A chat on an unread page whose updated_at is bumped moves above the cursor and is
    missing from the rest of that sweep (coderd's keyset compares current tuples)."""
    alice = sim.state.add_user("alice")
    chats = [sim.state.add_chat(alice, status="waiting", age=100 - i) for i in range(6)]
    _, page1, _ = await _get(sim, session, alice, "/api/v2/chats", limit="3")
    assert [c["id"] for c in page1] == [c.id for c in reversed(chats[3:])]
    sim.state.bump(chats[0].id)  # on page 2, now the newest of all
    _, page2, _ = await _get(
        sim, session, alice, "/api/v2/chats", limit="3", after_id=page1[-1]["id"]
    )
    assert [c["id"] for c in page2] == [chats[2].id, chats[1].id]


async def test_UpdateChatExecutionState_step_commits_bump_without_publishing(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """A long turn's step commits move updated_at (and its place in the list) while the
    status stays running, and publish no watch event."""
    alice = sim.state.add_user("alice")
    sim.state.subscribe(alice.id)
    chat = sim.state.add_chat(alice, status="running", progress_every=0.05, publish=False)
    before = chat.updated_at
    await asyncio.sleep(0.3)
    assert chat.updated_at > before and chat.status == "running"
    assert _drain(sim, alice) == []


async def test_bump_armed_between_pages_skips_the_chat_in_every_listing(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """The admin hook: chats bumped as a listing starts and one bumped after page 1 keep
    that one out of every sweep (the window the moving cursor leaves open)."""
    alice = sim.state.add_user("alice")
    moving = sim.state.add_chat(alice, status="running", age=500)
    others = [sim.state.add_chat(alice, status="waiting", age=10) for _ in range(5)]
    sim.state.bump_after_page[moving.id] = 1
    for other in others:
        sim.state.bump_after_page[other.id] = 0
    for _ in range(3):
        ids: list[str] = []
        after = ""
        while True:
            params = {"limit": "2", **({"after_id": after} if after else {})}
            _, rows, _ = await _get(sim, session, alice, "/api/v2/chats", **params)
            ids += [r["id"] for r in rows]
            if len(rows) < 2:
                break
            after = rows[-1]["id"]
        assert moving.id not in ids and sorted(ids) == sorted(c.id for c in others)


async def test_ParsePagination_accepts_any_int32_limit_and_defaults_to_50(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """No page-size maximum in any era: limit 5000 returns every row; omitted means 50."""
    alice = sim.state.add_user("alice")
    for _ in range(120):
        sim.state.add_chat(alice, status="waiting", publish=False)
    _, rows, _ = await _get(sim, session, alice, "/api/v2/chats", limit="5000")
    assert len(rows) == 120
    _, rows, _ = await _get(sim, session, alice, "/api/v2/chats")
    assert len(rows) == 50
    status, body, _ = await _get(sim, session, alice, "/api/v2/chats", limit="2147483648")
    assert status == 400 and body["validations"][0]["field"] == "limit"


async def test_archiveChat_publishes_deleted_for_every_family_member(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Archive publishes `deleted` with archived=true for the root and each child; unarchive
    publishes `created` for each."""
    alice = sim.state.add_user("alice")
    root = sim.state.add_chat(alice, status="waiting", publish=False)
    child = sim.state.add_chat(alice, status="waiting", parent=root, publish=False)
    sim.state.subscribe(alice.id)
    status, _ = await _post(sim, session, alice, f"/api/v2/chats/{root.id}", {"archived": True})
    assert status == 204
    events = _drain(sim, alice)
    assert [(e["kind"], e["chat"]["id"], e["chat"]["archived"]) for e in events] == [
        ("deleted", root.id, True),
        ("deleted", child.id, True),
    ]
    status, _ = await _post(sim, session, alice, f"/api/v2/chats/{root.id}", {"archived": False})
    assert status == 204
    assert [(e["kind"], e["chat"]["id"]) for e in _drain(sim, alice)] == [
        ("created", root.id),
        ("created", child.id),
    ]


async def test_requires_action_transition_publishes_only_action_required(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Entering requires_action publishes action_required (with tool calls) and no
    status_change."""
    alice = sim.state.add_user("alice")
    chat = sim.state.add_chat(alice, status="running", publish=False)
    sim.state.subscribe(alice.id)
    sim.state.set_status(chat.id, "requires_action")
    events = _drain(sim, alice)
    assert [e["kind"] for e in events] == ["action_required"]
    assert events[0]["tool_calls"][0]["tool_name"]


async def test_capacity_change_is_published_as_a_list_row_without_the_flag(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Queueing for capacity and admission each publish capacity_change: the list-row
    shape, no queued_for_capacity, updated_at unchanged (capacity writes do not bump it)."""
    alice = sim.state.add_user("alice")
    first = sim.state.add_chat(alice, status="running", publish=False)
    second = sim.state.add_chat(alice, status="running", publish=False)
    stamp = second.updated_at
    sim.state.subscribe(alice.id)
    sim.state.faults.capacity_roots = 1
    sim.state.tick()
    sim.state.tick()
    first.status = "waiting"
    sim.state.tick()
    events = [e for e in _drain(sim, alice) if e["kind"] == "capacity_change"]
    assert [e["chat"]["id"] for e in events] == [second.id, second.id]
    for e in events:
        assert "queued_for_capacity" not in e["chat"]
        assert timestamp(e["chat"]["updated_at"]) == pytest.approx(stamp, abs=1e-6)


async def test_getChat_encoding_omits_nil_pointers_and_false_capacity(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Go's encoding/json: nil pointers omitted (never null), summaries null, root_chat_id
    always set, queued_for_capacity only on a single GET and only when true."""
    alice = sim.state.add_user("alice")
    chat = sim.state.add_chat(alice, status="running")
    _, body, _ = await _get(sim, session, alice, f"/api/v2/chats/{chat.id}")
    for omitted in ("workspace_id", "build_id", "agent_id", "parent_chat_id", "last_error"):
        assert omitted not in body
    assert "queued_for_capacity" not in body
    assert body["last_turn_summary"] is None and body["summary"] is None
    assert body["root_chat_id"] == chat.id
    assert None not in [v for k, v in body.items() if k not in ("last_turn_summary", "summary")]
    chat.queued_for_capacity = True
    _, body, _ = await _get(sim, session, alice, f"/api/v2/chats/{chat.id}")
    assert body["queued_for_capacity"] is True
    _, rows, _ = await _get(sim, session, alice, "/api/v2/chats")
    assert "queued_for_capacity" not in rows[0], "list rows never carry the flag"


def test_RFC3339Nano_trims_trailing_zeros_and_keeps_offsets() -> None:
    """Timestamps have 0–9 fraction digits with trailing zeros trimmed, Z or ±hh:mm, and
    every form reads back as the same instant."""
    assert iso(1_796_000_000.0) == "2026-11-30T00:53:20Z"
    assert iso(1_796_000_000.5) == "2026-11-30T00:53:20.5Z"
    assert iso(1_796_000_000.25, offset_minutes=120) == "2026-11-30T02:53:20.25+02:00"
    assert iso(1_796_000_000.0, offset_minutes=-330) == "2026-11-29T19:23:20-05:30"
    for t in (1_796_000_000.0, 1_796_000_000.123456, time.time()):
        for off in (0, 120, -330):
            text = iso(t, offset_minutes=off)
            assert RFC3339NANO.match(text), text
            assert abs(timestamp(text) - t) < 1e-5


async def test_chat_timestamps_use_the_configured_zones(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """With several zones configured, chats are written in them (one per chat) and parse."""
    sim.state.utc_offsets = (0, 120, -330)
    alice = sim.state.add_user("alice")
    for _ in range(12):
        sim.state.add_chat(alice, status="waiting", publish=False)
    _, rows, _ = await _get(sim, session, alice, "/api/v2/chats")
    zones = {r["updated_at"][-6:] if r["updated_at"][-6] in "+-" else "Z" for r in rows}
    assert zones == {"Z", "+02:00", "-05:30"}


async def test_writeChatInvalidState_refuses_every_mutation_until_reconciled(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """An invalid execution state answers 409 "Chat is in an invalid state." to interrupt
    and archive until POST …/reconcile-invalid moves the chat to error."""
    alice = sim.state.add_user("alice")
    chat = sim.state.add_chat(alice, status="running")
    chat.invalid_state = True
    base = f"/api/v2/chats/{chat.id}"
    for status, body in (
        await _post(sim, session, alice, base + "/interrupt"),
        await _post(sim, session, alice, base, {"archived": True}),
    ):
        assert (status, body["message"]) == (409, "Chat is in an invalid state.")
    status, body = await _post(sim, session, alice, base + "/reconcile-invalid")
    assert status == 200 and body["status"] == "error"
    status, _ = await _post(sim, session, alice, base, {"archived": True})
    assert status == 204


async def test_reconcileInvalidChatState_answers(sim: Sim, session: aiohttp.ClientSession) -> None:
    """reconcile-invalid: 409 "Chat is not in an invalid state." for a consistent chat,
    404 for a missing or hidden one, 400 for an archived one, 503 with chatd off."""
    alice, bob = sim.state.add_user("alice"), sim.state.add_user("bob")
    chat = sim.state.add_chat(alice, status="running")
    url = f"/api/v2/chats/{chat.id}/reconcile-invalid"
    status, body = await _post(sim, session, alice, url)
    assert (status, body["message"]) == (409, "Chat is not in an invalid state.")
    assert (await _post(sim, session, bob, url))[0] == 404
    missing = f"/api/v2/chats/{uuid.uuid4()}/reconcile-invalid"
    assert (await _post(sim, session, alice, missing))[0] == 404
    done = sim.state.add_chat(alice, status="waiting")
    sim.state.archive(done.id)
    status, body = await _post(sim, session, alice, f"/api/v2/chats/{done.id}/reconcile-invalid")
    assert (status, body["message"]) == (400, "Cannot mutate an archived chat.")
    sim.state.faults.chatd_enabled = False
    assert (await _post(sim, session, alice, url))[0] == 503


async def test_patchChat_refuses_archive_while_a_family_member_is_paused(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Archive of a family with a member paused at a queued message under edit answers
    409 with coderd's own message (#29215)."""
    alice = sim.state.add_user("alice")
    root = sim.state.add_chat(alice, status="waiting")
    sim.state.add_chat(alice, status="paused", parent=root)
    status, body = await _post(sim, session, alice, f"/api/v2/chats/{root.id}", {"archived": True})
    assert status == 409 and body["message"].startswith(
        "Cannot archive: a chat in this family is paused at a queued message under edit."
    )


@pytest.mark.parametrize("era", ["D"])
async def test_reconcile_invalid_route_absent_before_the_newest_era(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Servers before the newest era have no reconcile-invalid route (404)."""
    alice = sim.state.add_user("alice")
    chat = sim.state.add_chat(alice, status="running")
    status, _ = await _post(sim, session, alice, f"/api/v2/chats/{chat.id}/reconcile-invalid")
    assert status == 404


# On the virtual clock: the sim's one-minute windows follow the loop, so no window
# boundary falls inside the test (on the host clock one did, now and then).
@pytest.mark.looptime
async def test_RateLimit_keys_by_user_and_concrete_path_over_a_sliding_window(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """httprate: every /chats/<id> has its own bucket per user; past the limit a 429 with
    Retry-After: 60 and X-RateLimit-*; the previous window still weighs in."""
    sim.state.rate_limit = 3
    alice = sim.state.add_user("alice")
    bob = sim.state.add_user("bob")
    a, b = (sim.state.add_chat(alice, status="waiting") for _ in range(2))
    for _ in range(3):
        status, _, headers = await _get(sim, session, alice, f"/api/v2/chats/{a.id}")
        assert status == 200 and headers["X-RateLimit-Limit"] == "3"
    status, body, headers = await _get(sim, session, alice, f"/api/v2/chats/{a.id}")
    assert status == 429 and headers["Retry-After"] == "60"
    assert headers["X-RateLimit-Remaining"] == "0" and int(headers["X-RateLimit-Reset"]) > 0
    assert "rate limited" in body["message"]
    assert (await _get(sim, session, alice, f"/api/v2/chats/{b.id}"))[0] == 200
    assert (await _get(sim, session, bob, "/api/v2/chats"))[0] == 200
    # Sliding: a full previous window keeps the bucket closed early in the next one.
    key = (alice.id, f"/api/v2/chats/{a.id}")
    start, _count, _prev = sim.state._rate[key]
    sim.state._rate[key] = (start - 60, 1000, 0)
    assert (await _get(sim, session, alice, f"/api/v2/chats/{a.id}"))[0] == 429


async def test_APIKey_middleware_does_not_close_an_open_watch_socket_on_revocation(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Revoking a token leaves an upgraded watch socket open and delivering; the next REST
    call is refused with 401."""
    alice = sim.state.add_user("alice")
    async with session.ws_connect(
        sim.url + "/api/v2/chats/watch", headers={"Coder-Session-Token": alice.token}
    ) as ws:
        await asyncio.sleep(0.1)
        sim.state.revoke("alice")
        sim.state.add_chat(alice, status="running", script=[Step("running")])
        msg = await ws.receive(timeout=5)
        assert msg.type == aiohttp.WSMsgType.TEXT and json.loads(msg.data)["kind"] == "created"
        assert (await _get(sim, session, alice, "/api/v2/chats"))[0] == 401
