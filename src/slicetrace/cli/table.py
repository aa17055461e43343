"""bench's table as nccl-tests prints it: header, rows and closing lines."""
from __future__ import annotations

HEADER = ("#{:>11} {:>12} {:>9} {:>6} {:>5} {:>10} {:>8} {:>8} {:>7}".format(
    "size", "count", "type", "redop", "root", "time(us)", "algbw", "busbw", "#wrong"))
UNITS = ("#{:>11} {:>12} {:>9} {:>6} {:>5} {:>10} {:>8} {:>8} {:>7}".format(
    "(B)", "(elements)", "", "", "", "", "(GB/s)", "(GB/s)", ""))


def summarize(rows: list[dict], check: bool) -> dict:
    """nccl-tests' closing lines: its error count, one per rank and row whose check found a wrong value (None when
    unchecked; #wrong holds the values), and the mean busbw over the rows."""
    s = {"out_of_bounds": sum(r["wrong_ranks"] for r in rows) if check else None,
         "avg_busbw": sum(r["busbw"] for r in rows) / len(rows) if rows else 0.0}
    if rows and "ref_busbw" in rows[0]:
        s["ref_avg_busbw"] = sum(r["ref_busbw"] for r in rows) / len(rows)
    return s


def format_summary(s: dict, ref_name: str | None) -> list[str]:
    oob = s["out_of_bounds"]
    verdict = "N/A (-c 0)" if oob is None else f"{oob} {'OK' if oob == 0 else 'FAILED'}"
    lines = [f"# Out of bounds values : {verdict}", f"# Avg bus bandwidth    : {s['avg_busbw']:g}"]   # as nccl-tests
    if "ref_avg_busbw" in s:
        lines.append(f"# Avg bus bandwidth of {ref_name} : {s['ref_avg_busbw']:g}")
    return lines


NCCL_TYPE = {"float16": "half", "float32": "float", "float64": "double"}    # nccl-tests' names; the rest alike


def us(t: float) -> str:
    """A time as nccl-tests prints it: 0 decimals from 10 ms, 1 from 100 us, else 2."""
    return f"{t:.0f}" if t >= 10000 else f"{t:.1f}" if t >= 100 else f"{t:.2f}"


def format_row(r: dict, ref: bool, overhead: bool) -> str:
    s = "{:>12} {:>12} {:>9} {:>6} {:>5} {:>10} {:>8.3f} {:>8.3f} {:>7}".format(
        r["size"], r["count"], NCCL_TYPE.get(r["type"], r["type"]), r["redop"], r["root"], us(r["time_us"]), r["algbw"],
        r["busbw"], "N/A" if r["wrong"] is None else r["wrong"])
    if ref:
        s += "  {:>8} {:>8.3f} {:>6}".format(us(r["ref_time_us"]), r["ref_busbw"],
                                             "N/A" if r["ratio"] is None else f"{r['ratio']:.2f}")
    if overhead:
        s += "  {:>8.2f}% [{:.1f}, {:.1f}]".format(r["overhead_pct"], *r["overhead_ci95_pct"])
        if "overhead_ci_coverage_pct" in r:          # fewer than 6 ratios: say what the interval covers
            n = r["overhead_ratios"]
            s += " ({:.0f}% CI: {} ratio{}; --rounds 12 for 95%)".format(r["overhead_ci_coverage_pct"], n,
                                                                        "" if n == 1 else "s")
    return s
