"""Every read from outside is bounded: Coder bodies, watch handshakes, receiver answers,
server hints; overflow is counted and the caller keeps working."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import pytest
import structlog

from tests.fakes.hostile import endless, huge_declared, never_upgrades, one_day_please, serving
from watchd.alerting.receivers.base import READ_CAPS, NotifyError, classify_http, post
from watchd.coder.client import CoderClient
from watchd.coder.errors import CoderError
from watchd.coder.transport import OversizeResponse, Transport
from watchd.kits.backoff import MAX_HINT, retry_hint
from watchd.store.health import IdentityHealth
from watchd.telemetry.ingest import IngestError, parse_batch


def _client(url: str, session: aiohttp.ClientSession, **kw: object) -> CoderClient:
    t = Transport(base_url=url, token="t", session=session)
    return CoderClient(t, prefix="/api/v2", attempts=1, **kw)  # type: ignore[arg-type]


async def test_an_endless_listing_is_cut_at_its_bound(session: aiohttp.ClientSession) -> None:
    """A listing page that never ends is read to its bound (scaled to the page size), raises
    OversizeResponse naming the bound, and is counted."""
    async with serving({"/api/v2/chats": endless}) as url:
        client = _client(url, session, page_size=10)
        with pytest.raises(OversizeResponse, match="8388608-byte bound"):
            await client.list_chats()
        assert client.transport.oversize == 1


async def test_a_single_read_has_its_own_bound(session: aiohttp.ClientSession) -> None:
    """A GET whose declared length is over the single-read bound is refused before reading."""
    async with serving({"/api/v2/chats/{id}": huge_declared}) as url:
        client = _client(url, session)
        with pytest.raises(OversizeResponse, match="exceeds the 4194304-byte bound"):
            await client.get_chat("0b7c0000-0000-4000-8000-000000000001")


async def test_a_watch_handshake_that_never_completes_times_out(
    session: aiohttp.ClientSession,
) -> None:
    """A server that accepts the dial and never upgrades fails it within the handshake
    timeout (a retryable network error), counted."""
    async with serving({"/api/v2/chats/watch": never_upgrades}) as url:
        t = Transport(base_url=url, token="t", session=session)
        t.handshake_timeout = 0.3
        with pytest.raises(CoderError, match=r"upgrade not completed within 0\.3s") as err:
            await t.ws_connect("/api/v2/chats/watch", heartbeat=5, reader=1, attempt=1)
        assert err.value.retryable and t.handshake_timeouts == 1


async def test_a_day_of_retry_after_is_capped(session: aiohttp.ClientSession) -> None:
    """Coder's Retry-After: 99999 becomes a wait of at most MAX_HINT: the identity is tried
    again as soon as the cap passes."""
    async with serving({"/api/v2/chats": one_day_please}) as url:
        with pytest.raises(CoderError) as err:
            await _client(url, session).list_chats()
        assert err.value.retry_after == MAX_HINT == 300.0


def test_retry_hints_take_seconds_dates_and_resets_capped() -> None:
    """One parser for every server: seconds, HTTP-date, retry-after-ms and X-RateLimit-Reset,
    each at most the cap."""
    now = 1_796_000_000.0
    assert retry_hint({"Retry-After": "7"}, server_now=now) == 7.0
    assert retry_hint({"retry-after": "Mon, 30 Nov 2026 00:54:20 GMT"}, server_now=now) == 60.0
    assert retry_hint({"retry-after-ms": "1500"}, server_now=now) == 1.5
    assert retry_hint({"X-RateLimit-Reset": str(int(now) + 42)}, server_now=now) == 42.0
    assert retry_hint({"Retry-After": "99999"}, server_now=now) == 300.0
    assert retry_hint({"Retry-After": "soon"}, server_now=now) is None


async def test_a_receiver_that_streams_forever_is_read_a_few_kib(
    session: aiohttp.ClientSession,
) -> None:
    """A receiver answering 200 with an endless body costs at most a few KiB (counted)."""
    async with serving({"/hook": endless}) as url:
        before = READ_CAPS["receiver_answers"]
        answer = await post(session, url + "/hook", body=b"{}", headers={}, deadline=5, who="r")
        assert answer.status == 200 and len(answer.text) <= 2000
        assert READ_CAPS["receiver_answers"] == before + 1


async def test_a_close_delimited_answer_is_read_to_its_end_and_not_counted_cut(
    session: aiohttp.ClientSession,
) -> None:
    """An HTTP/1.0 receiver whose 11-byte answer has no Content-Length (it ends when the
    receiver closes, a moment later) is read whole: not counted or logged as cut."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length: *(\d+)", head)
        await reader.readexactly(int(length.group(1)) if length else 0)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nhello world")
        await writer.drain()
        await asyncio.sleep(0.3)  # the body's end is the close, which comes later
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        before = READ_CAPS["receiver_answers"]
        with structlog.testing.capture_logs() as logged:
            url = f"http://127.0.0.1:{port}/hook"
            got = await post(session, url, body=b"{}", headers={}, deadline=5, who="r")
        assert got.status == 200 and got.text == "hello world"
        assert READ_CAPS["receiver_answers"] == before
        assert not [e for e in logged if e["event"] == "receiver.answer_cut"]
    finally:
        server.close()
        await server.wait_closed()


def test_a_receivers_http_date_retry_after_is_honoured() -> None:
    """A 429 with Retry-After as an HTTP-date is retryable after that long (capped)."""
    from email.utils import formatdate
    from time import time

    from watchd.alerting.receivers.base import HttpAnswer

    when = formatdate(time() + 120, usegmt=True)
    with pytest.raises(NotifyError) as err:
        classify_http(HttpAnswer(429, {"Retry-After": when}, "slow down"), who="slack")
    assert err.value.retryable and err.value.retry_after is not None
    assert 100 <= err.value.retry_after <= 121
    with pytest.raises(NotifyError) as err:
        classify_http(HttpAnswer(503, {"Retry-After": "86400"}, ""), who="pd")
    assert err.value.retry_after == 300.0


def test_deeply_nested_ingest_json_is_a_400_not_a_traceback() -> None:
    """A batch nested 100 000 deep is an IngestError (400), not a RecursionError."""
    body = b'{"source":{"service":"a","instance":"b"},"events":[' + b"[" * 100_000
    body += b"]" * 100_000 + b"]}"
    with pytest.raises(IngestError, match="nested too deeply"):
        parse_batch(body, content_type="application/json", query={})


def test_unknown_statuses_share_one_metrics_series(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fifty distinct status strings from a server become one `other` series (counted),
    not fifty: the metrics label space stays bounded."""
    from watchd.coder.observing import ChatId, Observation
    from watchd.config.loading import parse_config
    from watchd.config.secrets import resolve_secrets
    from watchd.daemon.app import Daemon

    monkeypatch.setenv("WATCHD_TEST_TOKEN", "token-value-0123456789")
    config = parse_config(
        {
            "identities": [
                {
                    "name": "team-a",
                    "url": "https://coder.example.com",
                    "token_env": "WATCHD_TEST_TOKEN",
                }
            ],
            "state_dir": str(tmp_path),
            "telemetry": {"exporter": "none"},
        }
    )
    d = Daemon(config, resolve_secrets(config))
    try:
        for i in range(50):
            chat = Observation(id=ChatId(f"c{i}"), status=f"weird-{i}", updated_at=1.0)
            d.store.observe("team-a", chat, now=2.0, via="listing")
        d.store.observe(
            "team-a",
            Observation(id=ChatId("r"), status="running", updated_at=1.0),
            now=2.0,
            via="listing",
        )
        d.health["team-a"] = d.health.get("team-a") or _health("team-a")
        text = d.metrics.render().decode()
        chats = [line for line in text.splitlines() if line.startswith("watchd_chats{")]
        assert 'watchd_chats{identity="team-a",status="other"} 50.0' in chats
        assert 'watchd_chats{identity="team-a",status="running"} 1.0' in chats
        assert not any("weird" in line for line in text.splitlines())
        assert "watchd_chats_unknown_status 50.0" in text
        for kind in ("confirm", "group", "watch", "detector"):
            assert f'watchd_task_restarts_total{{task="{kind}"}}' in text
            assert f'watchd_task_up{{task="{kind}"}}' in text
    finally:
        d.state_lock.release()
        d.db.close()


def _health(name: str) -> IdentityHealth:
    from watchd.kits.clock import ServerClock
    from watchd.store.health import IdentityHealth

    return IdentityHealth(
        name=name,
        deployment="https://coder.example.com",
        server_clock=ServerClock(),
        unhealthy_after=60,
    )


async def test_an_aggregation_group_overflow_is_in_metrics_and_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An alert refused a new group at the group limit shows up in /metrics
    (watchd_alert_group_overflow_total) and /status (group_overflow), not only a log line."""
    from watchd.alerting import dispatch, routing
    from watchd.alerting.model import Alert
    from watchd.alerting.silencing import Inhibitor, Silencer
    from watchd.config.alerting import RouteConfig
    from watchd.config.loading import parse_config
    from watchd.config.secrets import resolve_secrets
    from watchd.daemon.app import Daemon
    from watchd.daemon.status import status_document

    monkeypatch.setattr(dispatch, "MAX_GROUPS", 0)
    monkeypatch.setenv("WATCHD_TEST_TOKEN", "token-value-0123456789")
    config = parse_config(
        {
            "identities": [
                {"name": "a", "url": "https://coder.example.com", "token_env": "WATCHD_TEST_TOKEN"}
            ],
            "state_dir": str(tmp_path),
            "telemetry": {"exporter": "none"},
        }
    )
    d = Daemon(config, resolve_secrets(config))
    try:
        route = routing.build(RouteConfig.model_validate({"receiver": "r"}))
        d.dispatcher = dispatch.Dispatcher(
            route=route, notifiers={}, db=d.db, silencer=Silencer([]), inhibitor=Inhibitor([])
        )
        d.dispatcher.stats["r"] = dispatch.ReceiverStats()
        d.dispatcher.put(Alert(fingerprint="f", labels={"alertname": "X"}, starts_at=1.0))
        assert "watchd_alert_group_overflow_total 1.0" in d.metrics.render().decode()
        doc = await status_document(d)
        assert doc["group_overflow"] == 1 and doc["receivers"]["r"]["dropped"] == 1
    finally:
        d.state_lock.release()
        d.db.close()
