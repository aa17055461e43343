"""bench's closing lines, as nccl-tests prints them."""
import types

import pytest

from slicetrace.cli.bench import _gather
from slicetrace.cli.table import format_summary, summarize
from slicetrace.rendezvous import DictStore


def test_summary_counts_failed_checks_and_averages_busbw_as_nccl_tests_does():
    """nccl-tests' footer counts checks (args->errors[0]++ once per rank whose check found any wrong value), not
    wrong values: 7 wrong values on 2 ranks of one row and 3 on 1 rank of another are 3 errors."""
    rows = [{"wrong": 0, "wrong_ranks": 0, "busbw": 1.0, "ref_busbw": 0.5},
            {"wrong": 7, "wrong_ranks": 2, "busbw": 2.0, "ref_busbw": 0.25},
            {"wrong": 3, "wrong_ranks": 1, "busbw": 3.0, "ref_busbw": 0.375}]
    s = summarize(rows, check=True)
    assert s == {"out_of_bounds": 3, "avg_busbw": 2.0, "ref_avg_busbw": 0.375}
    assert format_summary(s, "gloo") == ["# Out of bounds values : 3 FAILED", "# Avg bus bandwidth    : 2",
                                         "# Avg bus bandwidth of gloo : 0.375"]
    unchecked = summarize([{"wrong": -1, "busbw": 4.0}], check=False)
    assert unchecked == {"out_of_bounds": None, "avg_busbw": 4.0}
    assert format_summary(unchecked, None)[0] == "# Out of bounds values : N/A (-c 0)"
    assert summarize([], check=True) == {"out_of_bounds": 0, "avg_busbw": 0.0}


class _Comm:
    """What bench's gather touches: rank, world size, settings.timeout_s and the session's store."""

    def __init__(self, store, rank, world):
        self.rank, self.world_size = rank, world
        self.settings = types.SimpleNamespace(timeout_s=5.0)
        self._session = types.SimpleNamespace(store=store)


@pytest.mark.parametrize("average, time, ref", [(0, 3.0, 30.0), (1, 4.0, 40.0), (2, 3.0, 30.0), (3, 5.0, 50.0)])
def test_rank_values_combine_as_nccl_tests_a_says_and_wrong_values_add_up(average, time, ref):
    store = DictStore({})
    per_rank = {1: [5.0, 2.0, 1.0, 50.0, 7.0], 2: [4.0, 0.0, 0.0, 40.0, 9.0], 0: [3.0, 1.0, 1.0, 30.0, 8.0]}
    for r in (1, 2):                                  # the other ranks post theirs and return them unchanged
        assert _gather(_Comm(store, r, 3), "k", per_rank[r], (0, 3), average) == per_rank[r]
    got = _gather(_Comm(store, 0, 3), "k", per_rank[0], (0, 3), average)
    assert got == [time, 3.0, 2.0, ref, 9.0]          # times per -a, wrong values and failed ranks summed, the max


@pytest.mark.parametrize("check, more", [(1, "and about 1,200 B more to check it (-c 0 skips the check)"), (0, None)])
def test_a_size_past_the_hosts_memory_is_a_usage_error_naming_e_and_the_bytes_per_rank(check, more):
    import numpy as np
    from slicetrace.cli.bench import _memory
    from slicetrace.errors import UsageError
    o = {"sizes": [40, 400], "check": check}
    with pytest.raises(UsageError) as e, _memory(o, "all_gather", 400, np.dtype("float32"), 2, 1):
        raise MemoryError()
    msg = str(e.value)
    assert msg.startswith("-e 400: all_gather of 400 B (float32) ran out of memory on rank 1: each rank needs at "
                          "least 600 B for its buffers")          # 50 elements in, 100 out
    assert (more in msg) if more else "check" not in msg


def test_a_size_past_the_hosts_memory_names_e_as_it_was_typed():
    """`-e 100G` read "-e 68719476736: ..." (the sweep's largest size, 4K x 2**k), a value the user never typed."""
    import numpy as np
    from slicetrace.cli.bench import _memory
    from slicetrace.errors import UsageError
    o = {"sizes": [4096, 2 ** 36], "check": 0, "maxbytes": "100G"}
    with pytest.raises(UsageError) as e, _memory(o, "all_reduce", 2 ** 36, np.dtype("float32"), 2, 0):
        raise MemoryError()
    assert str(e.value).startswith("-e 100G (the sweep's largest size: 68,719,476,736 B): all_reduce of "
                                   "68,719,476,736 B (float32) ran out of memory on rank 0")
    o["maxbytes"] = str(2 ** 36)
    with pytest.raises(UsageError, match=r"^-e 68719476736: all_reduce"), \
            _memory(o, "all_reduce", 2 ** 36, np.dtype("float32"), 2, 0):
        raise MemoryError()


def test_a_row_without_reference_bandwidth_has_no_ratio_and_the_json_stays_strict(tmp_path):
    """A 0-byte size against the reference had ratio NaN: the table printed nan and --json wrote NaN, which strict
    JSON parsers refuse."""
    import json
    import math

    from slicetrace.cli.table import format_row
    from slicetrace.cli.outputs import write_json
    row = {"size": 0, "count": 0, "type": "float32", "redop": "sum", "root": -1, "time_us": 3.0, "algbw": 0.0,
           "busbw": 0.0, "wrong": 0, "ref_time_us": 40.0, "ref_busbw": 0.0, "ratio": None}
    assert format_row(row, True, False).split()[-1] == "N/A"
    path = tmp_path / "r.json"
    write_json("--json", str(path), {"rows": [row], "x": [math.nan, math.inf, 1.5], "y": {"z": -math.inf}})

    def refuse(c):
        raise ValueError(c)
    got = json.loads(path.read_text(), parse_constant=refuse)
    assert got["rows"][0]["ratio"] is None and got["x"] == [None, None, 1.5] and got["y"] == {"z": None}


def test_gathered_values_leave_nothing_in_the_store():
    """Every size of every cycle left one key per rank in the launcher's store: -N 0 grew it without end."""
    store = DictStore({})
    for r in (1, 2):
        _gather(_Comm(store, r, 3), "c7/all_reduce/4096", [1.0, 0.0, 0.0], (0,), 3)
    _gather(_Comm(store, 0, 3), "c7/all_reduce/4096", [1.0, 0.0, 0.0], (0,), 3)
    assert store._d == {}


def test_the_overhead_figures_come_from_one_rank():
    """Each overhead figure was its own max over ranks: a row's profiled/unprofiled times could come from one rank
    and its percentage and interval ends from others (1.67x against a printed 90 %)."""
    store = DictStore({})
    r1 = [5.0, 0.0, 0.0, 100.0, 60.0, 1.90, 1.8, 2.0, 1.7, 2.1]
    r0 = [4.0, 0.0, 0.0, 150.0, 50.0, 1.20, 1.1, 1.3, 1.0, 2.5]
    assert _gather(_Comm(store, 1, 2), "k", r1, (0,), 3, 3) == r1
    assert _gather(_Comm(store, 0, 2), "k", r0, (0,), 3, 3) == [5.0, 0.0, 0.0] + r1[3:]


def test_integer_references_wrap_as_the_type_does():
    """The reference multiplied in float64: past 2**53 its cast to uint8 was not modular (255**4 gave 0, not 1),
    so a correct uint8 prod at 4 ranks counted 19 wrong values; avg wraps its sum in the type, then divides."""
    import numpy as np
    from slicetrace.cli.sweep import reference, wrong
    x = [np.array([255, 255, 2, 200], np.uint8)] * 4
    ref = reference("all_reduce", x, 0, 0, "prod")
    assert ref.astype(np.uint8).tolist() == [1, 1, 16, 0]
    assert wrong(np.array([1, 1, 16, 0], np.uint8), ref, np.uint8) == 0
    assert wrong(np.array([0, 1, 16, 0], np.uint8), ref, np.uint8) == 1
    y = [np.array([100, -100, 7], np.int8)] * 3                  # sums 300 -> 44, -300 -> -44, 21
    assert reference("all_reduce", y, 0, 0, "avg").tolist() == [14, -14, 7]


def test_times_and_the_average_print_as_nccl_tests_prints_them():
    """nccl-tests prints times with 2, 1 or 0 decimals by size (%7.2f below 100 us, %7.1f to 10 ms) and the average
    busbw with %g: a CPU run's small average printed 0.000 here."""
    from slicetrace.cli.table import format_row
    row = {"size": 8, "count": 2, "type": "float32", "redop": "sum", "root": -1, "algbw": 0.0, "busbw": 0.0,
           "wrong": 0, "ref_busbw": 0.0, "ratio": None}
    got = [format_row(dict(row, time_us=t, ref_time_us=t), True, False).split()[5::4]
           for t in (12.345, 123.45, 12345.6)]
    assert got == [["12.35", "12.35"], ["123.5", "123.5"], ["12346", "12346"]]
    assert format_summary({"out_of_bounds": 0, "avg_busbw": 0.000123}, None)[1] == "# Avg bus bandwidth    : 0.000123"


def _overhead_row(ratios: int, lo: float, hi: float) -> dict:
    row = {"size": 4096, "count": 1024, "type": "float32", "redop": "sum", "root": -1, "time_us": 10.0,
           "algbw": 1.0, "busbw": 1.0, "wrong": 0, "overhead_pct": -20.9, "overhead_ci95_pct": [lo, hi],
           "overhead_ratios": ratios}
    from slicetrace.cli.table import ci_coverage_pct
    if ratios < 6:
        row["overhead_ci_coverage_pct"] = ci_coverage_pct(ratios)
    return row


@pytest.mark.parametrize("ratios, header, tail", [
    (1, "[1 ratio: no interval]", "-20.90% (1 ratio: no interval; --rounds 12 for 95%)"),
    (2, "[50% CI of the median]", "-20.90% [-25.0, -10.0] (2 ratios; --rounds 12 for 95%)"),
    (3, "[75% CI of the median]", "-20.90% [-25.0, -10.0] (3 ratios; --rounds 12 for 95%)"),
    (6, "[95% CI of the median]", "-20.90% [-25.0, -10.0]")])
def test_the_overhead_header_and_rows_name_the_same_interval_and_one_ratio_shows_none(ratios, header, tail):
    """Before, the header always said 95 % while rows said '(50% CI: 2 ratios)', and one ratio printed a 0 %
    interval as the range [-20.9, -20.9]."""
    from slicetrace.cli.table import ci_words, format_row
    lo, hi = (-20.9, -20.9) if ratios == 1 else (-25.0, -10.0)
    assert f"[{ci_words(ratios)}]" == header
    assert format_row(_overhead_row(ratios, lo, hi), False, True).endswith("  " + tail)
