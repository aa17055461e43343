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


def ref_header(quads: int | None) -> str:
    """The reference's header cells; with --compare --rounds (`quads` ratios) the ratio's interval after it."""
    s = "  {:>8} {:>8} {:>6}".format("ref_us", "ref_bus", "ratio")
    return s if quads is None else f"{s} [{ci_words(quads)}]"


def format_row(r: dict, ref: bool, overhead: bool) -> str:
    s = "{:>12} {:>12} {:>9} {:>6} {:>5} {:>10} {:>8.3f} {:>8.3f} {:>7}".format(
        r["size"], r["count"], NCCL_TYPE.get(r["type"], r["type"]), r["redop"], r["root"], us(r["time_us"]), r["algbw"],
        r["busbw"], "N/A" if r["wrong"] is None else r["wrong"])
    if ref:
        s += "  {:>8} {:>8.3f} {:>6}".format(us(r["ref_time_us"]), r["ref_busbw"],
                                             "N/A" if r["ratio"] is None else f"{r['ratio']:.2f}")
        if "ratio_quads" in r:          # --rounds: the interval, as wide as its header (one ratio: none)
            n, ci = r["ratio_quads"], r["ratio_ci95"]
            s += " " + ("[{:.2f}, {:.2f}]".format(*ci) if n > 1 and ci else "").ljust(len(ci_words(n)) + 2)
    if overhead:
        n = r["overhead_ratios"]
        s += "  {:>8.2f}%".format(r["overhead_pct"])
        if n > 1:                                   # one ratio has no interval: [x, x] would read as a certain x
            s += " [{:.1f}, {:.1f}]".format(*r["overhead_ci95_pct"])
        if n < 6:                                   # the header says what the interval covers
            s += f" ({ci_words(n)}; --rounds 12 for 95%)" if n == 1 else f" ({n} ratios; --rounds 12 for 95%)"
    return s.rstrip()           # a --rounds ratio's blank interval at the end of the line


def ci_coverage_pct(ratios: int) -> float:
    """How often [min, max] of n ratios covers their median, 1 - 2/2**n; from 6 ratios the interval is 95 %'s."""
    return 95.0 if ratios >= 6 else (1 - 2 / 2 ** ratios) * 100


def ci_words(ratios: int) -> str:
    """--overhead's interval as the header and the rows name it."""
    return "1 ratio: no interval" if ratios <= 1 else f"{ci_coverage_pct(ratios):.0f}% CI of the median"
