"""What every notifier shares: the notification, the error type, HTTP posting.

Error messages name the receiver and the provider's answer, never its URL
or key: for Slack the webhook URL *is* the secret.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Protocol

import aiohttp
import orjson

from watchd.alerting.model import Alert
from watchd.kits import logs
from watchd.kits.backoff import retry_hint
from watchd.kits.clock import utc_second
from watchd.kits.redaction import REGISTRY

log = logs.get("watchd.alerting")

ZERO_TIME = "0001-01-01T00:00:00Z"


def rfc3339(ts: float | None) -> str:
    """Alertmanager's time text, to the millisecond (``…T…:…:….mmmZ``)."""
    if ts is None:
        return ZERO_TIME
    second, ms = divmod(round(ts * 1000), 1000)
    return f"{utc_second(second)}.{ms:03d}Z"


@dataclass(frozen=True)
class Notification:
    receiver: str
    group_key: str
    group_labels: Mapping[str, str]
    alerts: tuple[Alert, ...]
    external_url: str = ""
    truncated: int = 0

    @property
    def status_url(self) -> str:
        """The status page's URL under ``server.external_url`` (the base people reach
        watchd at), or "" without one."""
        return f"{self.external_url}/status" if self.external_url else ""

    @property
    def firing(self) -> list[Alert]:
        return [a for a in self.alerts if a.firing]

    @property
    def resolved(self) -> list[Alert]:
        return [a for a in self.alerts if not a.firing]

    @property
    def status(self) -> str:
        return "firing" if self.firing else "resolved"

    def common_labels(self) -> dict[str, str]:
        return _common([a.labels for a in self.alerts])

    def common_annotations(self) -> dict[str, str]:
        return _common([a.annotations for a in self.alerts])


def _common(maps: list[Mapping[str, str]]) -> dict[str, str]:
    """The pairs every map has, in the first map's order."""
    if not maps:
        return {}
    n = len(maps)
    # One key at a time over all the maps, the lookups in C (``map`` of ``dict.get``):
    # map by map in Python was a third of encoding a ten-thousand-alert webhook body.
    plain = all(type(m) is dict for m in maps)
    # Keys that already differ in a few of them are dropped before the full scan.
    sample = (maps[1 % n], maps[n // 2], maps[-1])
    out = {}
    for k, v in maps[0].items():
        if any(m.get(k) != v for m in sample):
            continue
        values: list[str | None]
        values = list(map(dict.get, maps, repeat(k))) if plain else [m.get(k) for m in maps]  # type: ignore[arg-type]
        if values.count(v) == n:
            out[k] = v
    return out


class NotifyError(Exception):
    def __init__(self, message: str, *, retryable: bool, retry_after: float | None = None) -> None:
        self.retryable = retryable
        self.retry_after = retry_after
        super().__init__(message)


@dataclass
class Rate:
    """A provider's documented pace: ``per_second`` sustained, ``burst`` at once."""

    per_second: float
    burst: int


class Notifier(Protocol):
    kind: str
    name: str
    rate: Rate
    send_resolved: bool
    # Firing alerts must be re-sent this often at the least. Set only by a receiver that
    # keeps its own copy of the alert state (an Alertmanager): such a receiver also gets
    # every alert watchd itself silences or inhibits, as Alertmanager's clients must post.
    resend_every: float | None

    async def notify(self, n: Notification) -> None: ...


@dataclass
class HttpAnswer:
    status: int
    headers: dict[str, str]
    text: str
    extra: dict[str, Any] = field(default_factory=dict)


# A receiver's answer is read only this far: it is a status and a short reason, and a
# receiver that streams forever must not fill our memory.
MAX_ANSWER = 8 * 1024
# Answers longer than MAX_ANSWER (only the start was read), for /status and /metrics.
READ_CAPS = {"receiver_answers": 0}


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The receiver's hint (``Retry-After`` seconds or HTTP-date, ``retry-after-ms``,
    ``X-RateLimit-Reset``), capped at MAX_HINT like every server's hint."""
    return retry_hint(headers, server_now=time.time())


async def read_answer(content: aiohttp.StreamReader) -> tuple[bytes, bool]:
    """The answer's body up to MAX_ANSWER bytes, and whether it went on past them.

    One ``read(n)`` returns what has arrived so far: a close-delimited body (HTTP/1.0, no
    ``Content-Length``) ends only when the receiver closes, so one read of a short answer
    is not its end. Read until the end or one byte past the bound, whichever comes first
    (the request's deadline bounds the wait).
    """
    raw = bytearray()
    while len(raw) <= MAX_ANSWER:
        chunk = await content.read(MAX_ANSWER + 1 - len(raw))
        if not chunk:
            return bytes(raw), False
        raw += chunk
    return bytes(raw[:MAX_ANSWER]), True


async def post(
    session: aiohttp.ClientSession,
    url: str,
    *,
    body: bytes,
    headers: Mapping[str, str],
    deadline: float,
    who: str,
) -> HttpAnswer:
    """POST; network failures become retryable NotifyErrors that do not show the URL."""
    try:
        async with session.post(
            url,
            data=body,
            headers={"Content-Type": "application/json", "User-Agent": "watchd", **headers},
            timeout=aiohttp.ClientTimeout(total=deadline),
            allow_redirects=False,
        ) as r:
            raw, cut = await read_answer(r.content)
            if cut:
                READ_CAPS["receiver_answers"] += 1
                log.warning("receiver.answer_cut", receiver=who, read_bytes=MAX_ANSWER)
            text = raw.decode("utf-8", "replace")[:2000]
            return HttpAnswer(r.status, dict(r.headers), text)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise NotifyError(f"{who}: network error: {type(exc).__name__}", retryable=True) from None


def classify_http(
    answer: HttpAnswer, *, who: str, ok: tuple[int, ...] = (200, 201, 202, 204)
) -> None:
    """Generic classification: 2xx ok; 408/425/429/5xx retryable; other 4xx permanent."""
    if answer.status in ok:
        return
    # A provider may quote the request (part of a webhook URL, a key): scrub it.
    snippet = REGISTRY.scrub(answer.text.strip().replace("\n", " ")[:200])
    retryable = answer.status in (408, 425, 429) or answer.status >= 500
    raise NotifyError(
        f"{who}: HTTP {answer.status}: {snippet}",
        retryable=retryable,
        retry_after=retry_after(answer.headers),
    )


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, default=_plain)


def _plain(obj: Any) -> Any:
    """What orjson does not serialise itself: other mappings (alert labels are Mappings)."""
    if isinstance(obj, Mapping):
        return dict(obj)
    if isinstance(obj, (tuple, set, frozenset)):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
