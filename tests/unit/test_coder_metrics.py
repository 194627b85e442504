"""watchd's own requests to Coder on /metrics: counted by method, route template and answer
class (429 apart), timed, and the rate limiter's waits per identity; every label from a
bounded set, never a chat id, a workspace id or a query."""

from __future__ import annotations

import contextlib

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.conftest import Sim
from watchd.coder import routes
from watchd.coder.client import CoderClient
from watchd.coder.errors import CoderError
from watchd.coder.transport import Transport
from watchd.daemon.metrics import CoderRequests
from watchd.kits.ratelimit import RateLimiter

UUID = "7a2bd334-3596-401b-ae1e-15035e79c1d5"


def test_paths_become_templates_and_every_label_is_bounded() -> None:
    """Ids and queries never reach a label: each path maps to its route's template, and
    unknown paths, methods and statuses to one value each."""
    assert routes.template(f"/api/v2/chats/{UUID}") == "/api/v2/chats/{chat}"
    assert routes.template(f"/api/experimental/chats/{UUID}/archive?x=1") == (
        "/api/experimental/chats/{chat}/archive"
    )
    assert routes.template("/api/v2/chats?limit=500&after_id=" + UUID) == "/api/v2/chats"
    assert routes.template(f"/api/v2/organizations/{UUID}/members/me/workspace-quota") == (
        "/api/v2/organizations/{organization}/members/{user}/workspace-quota"
    )
    assert routes.template("/api/v2/users/me") == "/api/v2/users/me"
    for unknown in (f"/api/v2/secret/{UUID}", "/api/v2/chats//cost", "/", "", "/api/v2/chats/"):
        assert routes.template(unknown) == routes.OTHER, unknown
    assert routes.method("GET") == "GET" and routes.method("BREW") == routes.OTHER
    assert [routes.status_class(s) for s in (200, 204, 302, 404, 429, 503, None, 99)] == [
        "2xx", "2xx", "3xx", "4xx", "429", "5xx", "error", "other",
    ]  # fmt: skip


def test_every_route_series_exists_from_the_start() -> None:
    """Each route's request counts (every answer class) and duration exist at 0 before the
    first request, so rate() sees the first 429."""
    registry = CollectorRegistry()
    CoderRequests(registry)
    for method, path in routes.ROUTES:
        for status in routes.STATUSES:
            labels = {"method": method, "path": path, "status": status}
            assert registry.get_sample_value("watchd_coder_requests_total", labels) == 0.0
        timed = {"method": method, "path": path}
        assert registry.get_sample_value("watchd_coder_request_duration_seconds_count", timed) == 0


async def test_the_clients_requests_are_counted_by_route_never_by_id(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """Every call the client makes lands on its route's template (none on ``other``), a
    429 is counted apart from its retry's 2xx, and no chat id appears on /metrics."""
    alice = sim.state.add_user("alice")
    chat = sim.state.add_chat(alice, title="x", status="running", publish=False)
    registry = CollectorRegistry()
    meter = CoderRequests(registry)
    transport = Transport(base_url=sim.url, token=alice.token, session=session, meter=meter)
    client = CoderClient(transport, prefix="/api/v2")
    sim.state.faults.throttle_next = 1
    sim.state.faults.throttle_retry_after = 0.01
    await client.list_chats()
    await client.get_chat(chat.id)
    for call in (
        client.chat_cost(chat.id),
        client.interrupt(chat.id),
        client.reconcile_invalid(chat.id),
        client.archive(chat.id),
        client.me(),
        client.organizations(),
        client.workspace_quota(UUID),
        client.workspace(UUID),
    ):
        with contextlib.suppress(CoderError):
            await call

    def count(method: str, path: str, status: str) -> float:
        labels = {"method": method, "path": path, "status": status}
        return registry.get_sample_value("watchd_coder_requests_total", labels) or 0.0

    assert count("GET", "/api/v2/chats", "429") == 1.0
    assert count("GET", "/api/v2/chats", "2xx") == 1.0
    assert count("GET", "/api/v2/chats/{chat}", "2xx") == 1.0
    text = generate_latest(registry).decode()
    assert chat.id not in text and UUID not in text and "limit=" not in text
    counted = {
        (s.labels["method"], s.labels["path"])
        for metric in registry.collect()
        if metric.name == "watchd_coder_requests"
        for s in metric.samples
        if s.name.endswith("_total") and s.value
    }
    assert len(counted) >= 8 and counted <= set(routes.ROUTES), counted - set(routes.ROUTES)
    timed = {"method": "GET", "path": "/api/v2/chats"}
    assert registry.get_sample_value("watchd_coder_request_duration_seconds_count", timed) == 2


@pytest.mark.looptime
async def test_the_rate_limiters_waits_are_measured_on_the_loop_clock(
    sim: Sim, session: aiohttp.ClientSession
) -> None:
    """At 2 requests/s with a burst of 1, the 2nd and 3rd requests each wait exactly half a
    second for the limiter (the 1st none): one second, on the identity's counter."""
    alice = sim.state.add_user("alice")
    registry = CollectorRegistry()
    transport = Transport(
        base_url=sim.url,
        token=alice.token,
        session=session,
        identity="team-a",
        limiter=RateLimiter(rate=2.0, burst=1),
        meter=CoderRequests(registry),
    )
    total = "watchd_coder_ratelimit_wait_seconds_total"
    await transport.request("GET", "/api/v2/users/me")
    assert registry.get_sample_value(total, {"identity": "team-a"}) is None  # never waited
    for _ in range(2):
        await transport.request("GET", "/api/v2/users/me")
    assert registry.get_sample_value(total, {"identity": "team-a"}) == 1.0
