"""bench's closing lines, as nccl-tests prints them."""
from slicetrace.cli.bench import format_summary, summarize


def test_summary_counts_wrong_values_and_averages_busbw_as_nccl_tests_does():
    rows = [{"wrong": 0, "busbw": 1.0, "ref_busbw": 0.5}, {"wrong": 3, "busbw": 2.0, "ref_busbw": 0.25}]
    s = summarize(rows, check=True)
    assert s == {"out_of_bounds": 3, "avg_busbw": 1.5, "ref_avg_busbw": 0.375}
    assert format_summary(s, "gloo") == ["# Out of bounds values : 3 FAILED", "# Avg bus bandwidth    : 1.500",
                                         "# Avg bus bandwidth of gloo : 0.375"]
    unchecked = summarize([{"wrong": -1, "busbw": 4.0}], check=False)
    assert unchecked == {"out_of_bounds": None, "avg_busbw": 4.0}
    assert format_summary(unchecked, None)[0] == "# Out of bounds values : N/A (-c 0)"
    assert summarize([], check=True) == {"out_of_bounds": 0, "avg_busbw": 0.0}
