"""The text of chat alerts: time stamps rendered as datetime renders them."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

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
