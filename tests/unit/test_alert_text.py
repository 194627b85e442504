"""The text of alerts: time stamps and durations rendered as before, however cached."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from watchd.alerting.receivers.base import rfc3339
from watchd.detection.alerts import iso


@pytest.mark.parametrize(
    "ts",
    [
        0.0,
        1.0,
        -1.5,
        -0.0000005,
        1e9 + 0.9999995,
        1e9 + 0.0000005,
        1e9 + 0.0000015,
        1764600000.123456,
        1764600000.9999996,
        -86400.25,
        4102444800.5,
    ],
)
def test_iso_is_datetimes_isoformat_with_z(ts: float) -> None:
    """iso() gives datetime's isoformat (microseconds rounded as it rounds) with a Z."""
    assert iso(ts) == datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def test_iso_matches_datetime_on_many_stamps() -> None:
    """Over many stamps, whole and fractional, remembered seconds or not, iso() agrees."""
    rng = random.Random(18)
    stamps = [rng.uniform(-1e9, 4e9) for _ in range(5000)]
    stamps += [rng.randint(0, 2 * 10**9) + (rng.randint(0, 10**6) + 0.5) / 1e6 for _ in range(5000)]
    stamps += [1764600000 + i / 1000 for i in range(3000)]
    for ts in stamps:
        assert iso(ts) == datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def test_rfc3339_is_alertmanagers_millisecond_text_on_many_stamps() -> None:
    """rfc3339() (a remembered second and its milliseconds) says what datetime says of
    the stamp rounded to the millisecond, with a Z; None is Go's zero time."""
    rng = random.Random(29)
    stamps = [rng.uniform(0, 4e9) for _ in range(5000)]
    stamps += [1764600000 + i / 1000 + 0.0004 for i in range(3000)] + [0.0, 1e9 + 0.9996]
    for ts in stamps:
        ms = round(ts * 1000)
        want = datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
        assert rfc3339(ts) == want.replace("+00:00", "Z"), ts
    assert rfc3339(None) == "0001-01-01T00:00:00Z"


def test_live_durations_are_format_duration() -> None:
    """The durations live() and the renderer say are format_duration's, remembered or not."""
    from watchd.config.fields import duration_text as _duration
    from watchd.config.fields import format_duration

    rng = random.Random(18)
    for x in [0.0, 0.5, 1.5, 2.5, 59.5, 60.49, 3599.5, 3 * 86400 + 0.5]:
        assert _duration(x) == format_duration(x)
    for _ in range(5000):
        x = rng.uniform(0, 1e6)
        assert _duration(x) == format_duration(x)


def test_mute_with_nothing_to_mute_keeps_every_alert() -> None:
    """No silence and no inhibition rule: mute keeps every alert, in order, counting none."""
    from watchd.alerting.model import Alert
    from watchd.alerting.silencing import Inhibitor, Silencer
    from watchd.alerting.stages import mute

    alerts = [Alert(f"f{i}", {"alertname": "ChatStuck"}) for i in range(3)]
    counts = {"silenced": 0, "inhibited": 0}
    out = mute(
        iter(alerts),
        active=iter(alerts),
        silencer=Silencer([]),
        inhibitor=Inhibitor([]),
        now=0.0,
        counts=counts,
    )
    assert out == alerts
    assert counts == {"silenced": 0, "inhibited": 0}
