"""The hand-counted bucket histogram both hot-path histograms use (kits/histogram)."""

from __future__ import annotations

from watchd.kits.histogram import Buckets, le


def test_a_value_on_a_bound_is_in_that_bounds_bucket_and_the_rest_in_inf() -> None:
    """Prometheus' le: 1.0 counts at le=1.0, 1.5 at le=2.5, 99 only at +Inf; the sum is
    every value's; the cumulative counts end at the total."""
    h = Buckets((1, 2.5, 5))
    for v in (0.2, 1.0, 1.5, 99.0):
        h.observe(v)
    assert h.cumulative() == [2, 3, 3, 4]
    assert h.sum == 101.7
    assert h.samples() == [("1.0", 2.0), ("2.5", 3.0), ("5.0", 3.0), ("+Inf", 4.0)]
    snap = h.snapshot()
    assert snap["buckets"] == [1.0, 2.5, 5.0, float("inf")]
    assert snap["counts"] == [2, 3, 3, 4] and snap["sum"] == 101.7
    assert le(60) == "60.0" and le(float("inf")) == "+Inf"
