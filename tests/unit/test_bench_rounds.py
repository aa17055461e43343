"""bench's ABBA rounds (bench_rounds.py), shared by --overhead and --compare --rounds: the order of the sides, the
quads' ratios and what a --compare row and the table make of them. No ranks and no torch."""
from __future__ import annotations

import argparse
import statistics

import pytest

from slicetrace.cli.bench_rounds import (compare_fields, quad_ratios, round_count, round_order, round_stats,
                                         run_rounds)
from slicetrace.cli.benchflags import check_flags
from slicetrace.cli.table import HEADER, format_row, ref_header
from slicetrace.errors import SliceTraceError, UsageError


def test_sides_alternate_as_abba_and_each_side_holds_each_place_equally_often():
    assert [round_order(r) for r in range(4)] == [("a", "b"), ("b", "a"), ("a", "b"), ("b", "a")]
    calls: list[str] = []

    def block(side: str):
        def run() -> float:
            calls.append(side)
            return float(len(calls))          # the call's position: which block ran when
        return run
    a, b = run_rounds(3, block("a"), block("b"))            # odd counts round up: 4 rounds, 2 quads
    assert round_count(3) == 4 and round_count(4) == 4
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert a == [1.0, 4.0, 5.0, 8.0] and b == [2.0, 3.0, 6.0, 7.0]      # per side, in round order
    firsts = [calls[2 * r] for r in range(4)]
    assert firsts.count("a") == firsts.count("b") == 2


def test_a_drift_that_grows_through_the_run_cancels_in_each_quad():
    """One block of each side, one after the other, reads the drift as a difference: a machine slowing 10 % per
    block makes B (truly 2x A) read 2.2x; each ABBA quad's ratio is 2 exactly."""
    calls = []

    def block(base: float):
        def run() -> float:
            calls.append(base)
            return base * (1 + 0.1 * (len(calls) - 1))
        return run
    a, b = run_rounds(8, block(1.0), block(2.0))
    assert b[0] / a[0] == pytest.approx(2.2)
    assert quad_ratios(a, b) == pytest.approx([2.0] * 4)


def test_stats_are_the_medians_of_each_side_and_of_the_quads_ratios():
    a = [1.0, 1.0, 2.0, 2.0, 1.0, 3.0, 1.0, 1.0, 2.0, 2.0, 1.0, 1.0]
    b = [2.0, 2.0, 3.0, 3.0, 5.0, 3.0, 1.0, 1.0, 4.0, 4.0, 3.0, 3.0]
    st = round_stats(a, b)
    assert quad_ratios(a, b) == [2.0, 1.5, 2.0, 1.0, 2.0, 3.0]
    assert (st.a_median, st.b_median, st.ratio, st.quads) == (1.0, 3.0, 2.0, 6)
    q1, _, q3 = statistics.quantiles([2.0, 1.5, 2.0, 1.0, 2.0, 3.0], n=4, method="inclusive")
    assert (st.q1, st.q3) == (q1, q3) == (1.625, 2.0)
    assert (st.lo, st.hi) == (1.0, 3.0)         # 6 ratios: the 95 % interval is the whole sample
    one = round_stats([1.0, 3.0], [4.0, 4.0])
    assert (one.ratio, one.q1, one.q3, one.lo, one.hi, one.quads) == (2.0, 2.0, 2.0, 2.0, 2.0, 1)


@pytest.mark.parametrize("a, b, want", [
    ([1.0, 1.0], [1.0], r"^block times: a has 2 and b 1; each side needs the same even count >= 2"),
    ([1.0], [1.0], r"^block times: a has 1 and b 1;"),
    ([], [], r"^block times: a has 0 and b 0;"),
    ([1.0, 0.0], [1.0, 1.0], r"^block times \[0\.0\] must be > 0 seconds$"),
])
def test_bad_block_times_are_clear_errors(a, b, want):
    with pytest.raises(UsageError, match=want):
        quad_ratios(a, b)


def test_no_rounds_is_refused():
    with pytest.raises(UsageError, match=r"^rounds=0 must be >= 1$"):
        run_rounds(0, lambda: 1.0, lambda: 1.0)


def _row(**kw) -> dict:
    row = {"size": 4096, "count": 1024, "type": "float32", "redop": "sum", "root": -1, "time_us": 50.0,
           "algbw": 0.08, "busbw": 0.08, "wrong": 0, "ref_time_us": 250.0, "ref_busbw": 0.016, "ratio": 5.0}
    return {**row, **kw}


def test_a_compare_row_keeps_the_median_its_interval_and_spread():
    st = round_stats([1.0, 1.0] * 6, [5.0, 6.0, 4.0, 5.0, 6.0, 7.0, 5.0, 5.0, 4.0, 6.0, 7.0, 5.0])
    row = _row()
    compare_fields(row, st)
    assert row["ratio"] == st.ratio == 5.25 and row["ratio_ci95"] == [st.lo, st.hi] == [4.5, 6.5]
    assert row["ratio_iqr"] == [st.q1, st.q3] and row["ratio_quads"] == 6 and "ratio_ci_coverage_pct" not in row
    few = _row()
    compare_fields(few, round_stats([1.0] * 4, [2.0, 2.0, 3.0, 3.0]))
    assert few["ratio_quads"] == 2 and few["ratio_ci_coverage_pct"] == 50.0
    empty = _row(size=0, busbw=0.0, ref_busbw=0.0, ratio=None)      # 0 bytes: no ratio, so no interval either
    compare_fields(empty, st)
    assert empty["ratio"] is None and empty["ratio_ci95"] is None and empty["ratio_iqr"] is None


def test_the_table_prints_the_interval_under_its_header_and_one_block_rows_as_before():
    plain = format_row(_row(), True, False)
    assert plain.endswith("    250.0    0.016   5.00") and ref_header(None) == "    ref_us  ref_bus  ratio"
    head = HEADER + ref_header(6)
    assert head.endswith("ratio [95% CI of the median]")
    st = round_stats([1.0, 1.0] * 6, [5.0, 6.0, 4.0, 5.0, 6.0, 7.0, 5.0, 5.0, 4.0, 6.0, 7.0, 5.0])
    row = _row()
    compare_fields(row, st)
    text = format_row(row, True, False)
    assert text.endswith("   5.25 [4.50, 6.50]") and text.index("[") == head.index("[")
    # with --overhead after it, the interval keeps its header's width, so the overhead column lines up
    over = {"overhead_ratios": 6, "overhead_pct": 3.0, "overhead_ci95_pct": [1.0, 5.0]}
    both = format_row({**row, **over}, True, True)
    head2 = head + "  {:>9} [{}]".format("overhead", "95% CI of the median")
    assert both.index("%") == head2.index("overhead") + len("overhead") - 1      # '%' under its last letter
    one = _row()
    compare_fields(one, round_stats([1.0, 1.0], [5.0, 5.0]))
    assert HEADER + ref_header(1) == HEADER + "    ref_us  ref_bus  ratio [1 ratio: no interval]"
    assert format_row(one, True, False).endswith("   5.00")    # one ratio: no interval, no trailing blanks


def _bench_args(*argv: str) -> argparse.Namespace:
    from slicetrace.cli.main import _bench_parser
    sub = argparse.ArgumentParser().add_subparsers(dest="cmd")
    _bench_parser(sub)
    return sub.choices["bench"].parse_args(list(argv))


def test_rounds_counts_with_compare_or_overhead_and_is_refused_alone():
    assert check_flags(_bench_args("--rounds", "4", "--compare", "gloo")) == ["all_reduce"]
    assert check_flags(_bench_args("--rounds", "4", "--overhead")) == ["all_reduce"]
    with pytest.raises(SliceTraceError, match=r"^--rounds 4 counts only with --overhead or --compare \(gloo, nccl\)$"):
        check_flags(_bench_args("--rounds", "4"))
    with pytest.raises(SliceTraceError, match=r"^--rounds 0 must be >= 1$"):
        check_flags(_bench_args("--rounds", "0", "--compare", "gloo"))
