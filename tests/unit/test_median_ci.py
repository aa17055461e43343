"""bench --overhead's confidence interval of the median (order statistics, no assumption on the noise)."""
from __future__ import annotations

import math
import statistics

from hypothesis import given, settings, strategies as st

from slicetrace.cli.bench_rounds import median_ci


def test_interval_covers_the_median_with_at_least_95_percent_and_matches_the_tables():
    for n in range(6, 301):
        lo, hi = median_ci(list(range(1, n + 1)))        # sorted ranks: the interval is [x(lo), x(hi)]
        coverage = sum(math.comb(n, b) for b in range(lo, hi)) / 2 ** n
        assert coverage >= 0.95, (n, lo, hi, coverage)
        # and not wider than needed: one rank narrower on each side would drop below 95 %
        assert sum(math.comb(n, b) for b in range(lo + 1, hi - 1)) / 2 ** n < 0.95, (n, lo, hi)
    assert median_ci(list(range(1, 61))) == (22, 39)     # the usual table values for n = 60 and 100
    assert median_ci(list(range(1, 101))) == (40, 61)


@settings(deadline=None)                # a loaded host can hold one example past the 200 ms default
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=300))
def test_interval_holds_the_sample_median(xs):
    lo, hi = median_ci(xs)
    assert min(xs) <= lo <= statistics.median(xs) <= hi <= max(xs)
