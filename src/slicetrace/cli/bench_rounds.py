"""bench's rounds: two kinds of timed block, A and B, alternated as ABBA, and the median of the quads' ratios B/A
with a distribution-free confidence interval. --overhead (A unprofiled, B profiled) and --compare with --rounds (A
ours, B the reference) share them.

Why ABBA: the machine's speed drifts by more than the effects measured (2-3x between minutes on the 2-core host),
and a block runs slower in a round's second place than in its first (a per-round ratio then splits into two
populations, whose median depends on the run's history: 3-5 % against 9-13 % for KernelStep at 1 MiB,
docs/benchmarks.md). Adjacent blocks, order swapped every round, and the ratio of each two rounds' sums (A B | B A,
a quad) give each kind each place once per ratio."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

from ..errors import UsageError
from .table import ci_coverage_pct


def round_count(rounds: int) -> int:
    """Rounds run for `rounds` asked: odd counts round up, so that every round has its quad."""
    return rounds + rounds % 2


def round_order(rnd: int) -> tuple[str, str]:
    """The sides of round `rnd` in the order they run: A first in even rounds, B first in odd ones."""
    return ("a", "b") if rnd % 2 == 0 else ("b", "a")


def run_rounds(rounds: int, block_a: Callable[[], float], block_b: Callable[[], float]
               ) -> tuple[list[float], list[float]]:
    """(A's block times, B's), one each per round, round_count(rounds) rounds in round_order."""
    if rounds < 1:
        raise UsageError(f"rounds={rounds} must be >= 1")
    times: dict[str, list[float]] = {"a": [], "b": []}
    blocks = {"a": block_a, "b": block_b}
    for rnd in range(round_count(rounds)):
        for side in round_order(rnd):
            times[side].append(blocks[side]())
    return times["a"], times["b"]


def quad_ratios(a: list[float], b: list[float]) -> list[float]:
    """B/A per quad: the sum of B's two blocks over A's, rounds 0-1, 2-3, ..."""
    if len(a) != len(b) or not a or len(a) % 2:
        raise UsageError(f"block times: a has {len(a)} and b {len(b)}; each side needs the same even count "
                         f">= 2 (one block per round, two rounds per quad)")
    bad = [x for x in (*a, *b) if not x > 0]
    if bad:
        raise UsageError(f"block times {bad} must be > 0 seconds")
    return [(b[i] + b[i + 1]) / (a[i] + a[i + 1]) for i in range(0, len(a), 2)]


@dataclass(frozen=True)
class RoundStats:
    """What a row shows of its rounds: each side's median block, and the quads' ratios B/A: their median,
    interquartile range (q1, q3) and the confidence interval of the median (lo, hi)."""
    a_median: float
    b_median: float
    ratio: float
    q1: float
    q3: float
    lo: float
    hi: float
    quads: int


def round_stats(a: list[float], b: list[float]) -> RoundStats:
    ratios = quad_ratios(a, b)
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    lo, hi = median_ci(ratios)
    return RoundStats(statistics.median(a), statistics.median(b), statistics.median(ratios), q1, q3, lo, hi,
                      len(ratios))


def median_ci(xs: list[float], level: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: order statistics j, k of the sorted sample with
    P(j <= B < k) >= level for B ~ Binomial(n, 1/2) (no assumption on how the rounds' noise is shaped)."""
    x = sorted(xs)
    n = len(x)
    if n < 6:                           # too few rounds for any interval narrower than the whole sample
        return x[0], x[-1]
    tail, cdf, j = (1 - level) / 2, 0.0, 0
    while j < n // 2:
        p = math.comb(n, j) / 2 ** n
        if cdf + p > tail:
            break
        cdf += p
        j += 1
    return x[max(j - 1, 0)], x[min(n - j, n - 1)]


def compare_fields(row: dict, st: RoundStats) -> None:
    """A row's --compare figures from its rounds (A ours, B the reference): the ratio is the median of the quads'
    (the reference's time over ours: the busbw ratio, same bytes), with its interval and spread; the time columns
    are each side's median block (bench sets them)."""
    has = row["ratio"] is not None                  # 0 bytes: no ratio, so no interval of one either
    row["ratio"] = st.ratio if has else None
    row["ratio_iqr"] = [st.q1, st.q3] if has else None
    row["ratio_ci95"] = [st.lo, st.hi] if has else None
    row["ratio_quads"] = st.quads
    if st.quads < 6:                    # the interval is the whole sample: it covers the median 1 - 2/2**n only
        row["ratio_ci_coverage_pct"] = ci_coverage_pct(st.quads)
