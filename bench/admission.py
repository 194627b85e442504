"""``GET /v1/admission`` under load: the answer a dispatcher asks before it fans out.

An in-process daemon (not running: no Coder at all, as the endpoint promises) holds
``identities`` identities of ``chats`` chats each and 20 000 firing alerts; a separate
process (its threads never compete with the daemon's loop for the GIL) asks for a
random identity's answer from ``clients`` threads back to back, bearer token included.
The baseline is ``/healthz`` from the same server under the same load (issue 28's
target: admission p99 < 5 ms).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cases import Row, row

TOKEN = "bench-ingest-token-0123456789"

# Each client keeps one connection open (as a dispatcher's fetch does) and asks again as
# soon as it has its answer.
_PROBE = r"""
import http.client, json, random, sys, threading, time
host, port = sys.argv[1].rsplit(":", 1)
path, names, clients = sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])
seconds, token = float(sys.argv[5]), sys.argv[6]
took = []
def client(seed):
    rng = random.Random(seed)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        conn.request("GET", path.format(rng.choice(names)),
                     headers={"Authorization": "Bearer " + token})
        r = conn.getresponse()
        r.read()
        assert r.status == 200, r.status
        took.append(time.perf_counter() - t)
threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(took))
"""


def admission(identities: int, chats: int, clients: int = 4, seconds: float = 5.0) -> list[Row]:
    return asyncio.run(_admission(identities, chats, clients, seconds))


def _p(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))]


def _daemon(identities: int, chats: int) -> tuple[Any, list[str]]:
    """A daemon (not run) holding the identities, their chats and 20 000 alerts."""
    from watchd.alerting.model import Alert
    from watchd.coder.observing import Quota
    from watchd.config.loading import parse_config
    from watchd.config.secrets import resolve_secrets
    from watchd.daemon.app import Daemon
    from watchd.kits.clock import ServerClock
    from watchd.store.health import IdentityHealth
    from watchd.store.records import ChatRecord

    tmp = Path(tempfile.mkdtemp(prefix="watchd-bench-admission-"))
    os.environ.setdefault("WATCHD_BENCH_TOKEN", "bench-token-0123456789")
    os.environ["WATCHD_BENCH_INGEST"] = TOKEN
    url = "https://coder.example.com"
    names = [f"team-{k}" for k in range(identities)]
    config = parse_config(
        {
            "identities": [
                {"name": n, "url": url, "token_env": "WATCHD_BENCH_TOKEN"} for n in names
            ],
            "state_dir": str(tmp),
            "telemetry": {"exporter": "none"},
            "server": {"ingest_token_env": "WATCHD_BENCH_INGEST", "listen": "127.0.0.1:0"},
        }
    )
    d = Daemon(config, resolve_secrets(config))
    now = time.time()
    statuses = ("running", "waiting", "pending", "requires_action")
    records = []
    for n in names:
        h = IdentityHealth(name=n, deployment=url, server_clock=ServerClock(), unhealthy_after=60)
        h.set_state("ready")
        h.quota = Quota(credits_consumed=400, budget=1000)
        d.health[n] = h
        records += [
            ChatRecord(
                identity=n,
                chat_id=f"{n}-{i}",
                status=statuses[i % 4],
                since=now - 60,
                clock="transition",
                updated_at=now - 60,
                seen_at=now,
                queued_for_capacity=i % 7 == 0,
            )
            for i in range(chats)
        ]
    d.store.load(records)
    for i in range(20_000):
        d.detector.firing[f"fp{i}"] = Alert(
            f"fp{i}", {"alertname": "ChatStuck", "identity": names[i % identities]}, {}, now
        )
    return d, names


async def _admission(identities: int, chats: int, clients: int, seconds: float) -> list[Row]:
    d, names = _daemon(identities, chats)
    server = d.server  # the daemon's own HTTP face, as built by the daemon
    bound = await server.start()
    beat = asyncio.create_task(_beat(d))
    try:
        asked = await _probe(bound, "/v1/admission?identity={}", names, clients, seconds)
        healthz = await _probe(bound, "/healthz?x={}", names, clients, seconds)
    finally:
        beat.cancel()
        await server.stop()
        d.db.close()
    label = f"admission, {identities} identities × {chats} chats, {clients} clients"
    return [
        row(
            f"{label}: p99",
            _p(asked, 0.99) * 1000,
            "ms",
            baseline=_p(healthz, 0.99) * 1000,
            baseline_name="/healthz p99, same server, same load",
            target="< 5 ms",
        ),
        row(f"{label}: p50", _p(asked, 0.5) * 1000, "ms", baseline=_p(healthz, 0.5) * 1000),
        row(f"{label}: answers/s", len(asked) / seconds, "1/s"),
    ]


async def _beat(d: Any) -> None:
    """What the daemon's heartbeat task does, so /healthz says ok."""
    while True:
        d.last_beat = time.monotonic()
        await asyncio.sleep(0.5)


async def _probe(
    bound: str, path: str, names: list[str], clients: int, seconds: float
) -> list[float]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _PROBE,
        bound,
        path,
        ",".join(names),
        str(clients),
        str(seconds),
        TOKEN,
        stdout=subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    took: list[float] = json.loads(out)
    return took


if __name__ == "__main__":
    size = [int(a) for a in sys.argv[1:3]] + [50, 2_000][len(sys.argv[1:3]) :]
    for r in admission(size[0], size[1]):
        print(f"{r['name']}: {r['value']:.3g} {r['unit']} (baseline {r['baseline']})")
