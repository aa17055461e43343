"""`slicetrace diff BASE NEW`: two bench --json runs compared row by row (or two report --json files link by link),
non-zero exit on a regression (for CI)."""
from __future__ import annotations

import argparse
import sys

from ..analyze.atomic import STDOUT
from ..errors import UsageError, plural
from .outputs import names_stdout, writable_file, write_json
from .table import NCCL_TYPE, us
from .trace_cmds import _same_file

EXIT = ("exit status: 0 no regression; 1 a regression (beyond --threshold and, with >= 3 samples a side, outside "
        "BASE's range) or a wrong result in NEW; 2 refused: a file that is no bench or report --json, bench files "
        "with report files, bad flags, nothing in common, or with --strict runs set up differently")
WORDS = {"regression": "regression", "wrong": "WRONG", "noise": "within noise", "improved": "improved",
         "same": "same"}


def diff_parser(sub) -> None:
    p = sub.add_parser("diff", help="compare two bench --json runs: what got slower, beyond noise; exit 1 on a "
                       "regression", epilog=EXIT)
    p.add_argument("base", metavar="BASE", help="the reference run: a bench --json file, a folder of them or a "
                   "glob (their rows pool: per row the median and range); or report --json files, compared by link")
    p.add_argument("new", metavar="NEW", help="the run to check, given as BASE")
    p.add_argument("--threshold", type=float, default=5.0, metavar="PCT",
                   help="a change smaller than this is the same: %% of BASE's median busbw (and --compare ratio, "
                   "a link's GB/s), points of the --overhead %% and of a link's wait share (default 5)")
    p.add_argument("--strict", action="store_true", help="runs set up differently (backend, ranks, settings, -n, "
                   "-w, profiling ...) are an error (exit 2), not a warning")
    p.add_argument("--json", metavar="FILE", help="write every row's numbers and verdict as JSON ('-': standard "
                   "output, the text then goes to stderr)")


def run_diff(a: argparse.Namespace) -> int:
    from ..analyze import diff
    if not 0 <= a.threshold < 100:      # NaN fails too
        raise UsageError(f"--threshold {a.threshold:g} must be a percentage >= 0 and < 100 (default 5)")
    a.json = STDOUT if a.json is not None and names_stdout(a.json) else a.json
    if a.json is not None:
        writable_file("--json", a.json, stdout_ok=True)
    base, new = diff.load_side(a.base, "BASE"), diff.load_side(a.new, "NEW")
    if base.kind != new.kind:
        raise UsageError(f"BASE {a.base!r} holds {base.kind} --json files and NEW {a.new!r} {new.kind} --json files; "
                         f"give two of one kind (bench runs, or reports)")
    clash = next((f for f in base.files + new.files if a.json not in (None, STDOUT) and _same_file(f, a.json)), None)
    if clash is not None:
        raise UsageError(f"--json {a.json!r} is one of the inputs ({clash!r}); give another file, e.g. diff.json")
    out = sys.stderr if a.json == STDOUT else sys.stdout

    def say(line: str) -> None:
        print(line, file=out)
    setup = diff.differences(base.setups, new.setups)
    within = {s.name: diff.within(s.setups) for s in (base, new)}
    if a.strict and (setup or any(within.values())):
        raise UsageError("--strict: the runs are set up differently: " + "; ".join(
            setup + [f"within {k}: {w}" for k, ws in within.items() for w in ws]))
    res = diff.compare_rows(base.rows, new.rows, a.threshold / 100, base.kind)
    key = diff.KEY if base.kind == "bench" else diff.LINK_KEY
    say(f"# slicetrace diff: BASE {_files(base)} vs NEW {_files(new)}; threshold {a.threshold:g}%")
    for line in _warnings(base, new, setup, within, diff.differences(base.envs, new.envs)):
        say(line)
    if not res["rows"]:
        raise UsageError(f"BASE {a.base!r} ({plural(len(base.rows), 'row')}) and NEW {a.new!r} "
                         f"({plural(len(new.rows), 'row')}) have no row in common (rows match by "
                         f"{', '.join(key)}): nothing to compare; give runs of the same sweep")
    spread = any(r["metrics"].get(r["speed_metric"], {}).get(s, {}).get("samples", 0) > 1
                 for r in res["rows"] for s in ("base", "new"))
    for line in (_table if base.kind == "bench" else _link_table)(res["rows"], spread):
        say(line)
    for side, name in (("only_base", "BASE"), ("only_new", "NEW")):
        for k in res[side]:
            say(f"# only in {name}: {_label(k)}, {plural(k['samples'], 'sample')}"
                + (f", {k['wrong']} wrong" if (k["wrong"] or 0) > 0 else ""))
    for line in _summary(res, a.threshold):
        say(line)
    if a.json is not None:
        write_json("--json", a.json, {
            "kind": base.kind, "base": _side(base), "new": _side(new), "threshold_pct": a.threshold, "key": list(key),
            "min_spread_samples": diff.MIN_SPREAD_SAMPLES, "setup_differences": setup, "setup_within": within,
            "env_differences": diff.differences(base.envs, new.envs), **res})
    return 1 if res["failed"] else 0


def _files(side) -> str:
    names = ", ".join(side.files[:3]) + (f", ... ({len(side.files)} files)" if len(side.files) > 3 else "")
    return f"{names} ({plural(len(side.rows), 'row')}{' pooled' if len(side.files) > 1 else ''})"


def _side(side) -> dict:
    return {"files": side.files, "rows": len(side.rows), "incomplete": side.incomplete}


def _warnings(base, new, setup: list[str], within: dict, env: list[str]) -> list[str]:
    lines = []
    if setup:
        lines.append("# warning: the runs are set up differently (a fair comparison needs the same setup; --strict "
                     "refuses): " + "; ".join(setup))
    lines += [f"# warning: {k}'s files are set up differently, their rows pooled anyway: {'; '.join(w)}"
              for k, w in within.items() if w]
    if env:
        lines.append("# environment: " + "; ".join(env))
    lines += [f"# warning: {s.name} {why}: the run did not complete; its rows are compared as far as it got"
              for s in (base, new) for why in s.incomplete]
    return lines


def _label(k: dict) -> str:
    if "src" in k:
        return f"link {k['src']}->{k['dst']}"
    where = ", in place" if k["inplace"] else ""
    root = f", root {k['root']}" if k["root"] != -1 else ""
    redop = f" {k['redop']}" if k["redop"] != "none" else ""
    return (f"{k['op']} {k['size']} B {NCCL_TYPE.get(k['type'], k['type'])}{redop}{root}{where}, "
            f"{k['ranks']} ranks, {k['backend']}")


# the row's format; the header lines are the same with '#' for its first (blank) character, as bench's table
_ROW = "{:>15} {:>12} {:>8} {:>6} {:>5} {:>5} {:>5}  {:>8} {:>8} {:>8}  {:>9} {:>9} {:>7} {:>6}  {:<12}"


def _table(rows: list[dict], spread: bool) -> list[str]:
    fmt = _ROW + ("  {:>17} {:>17}" if spread else "")
    lines = ["#" + fmt.format("op", "size", "type", "redop", "root", "ranks", "place", "base_bus", "new_bus",
                                  "change", "base_us", "new_us", "samples", "#wrong", "verdict",
                                  "base busbw range", "new busbw range")[1:].rstrip(),
             "#" + fmt.format("", "(B)", "", "", "", "", "", "(GB/s)", "(GB/s)", "", "", "", "b/n", "new", "",
                                  "(GB/s)", "(GB/s)")[1:].rstrip()]
    for r in rows:
        m = r["metrics"]
        speed, t = m[r["speed_metric"]], m["time_us"]
        bus = m.get("busbw")
        line = fmt.format(
            r["op"], r["size"], NCCL_TYPE.get(r["type"], r["type"]), r["redop"], r["root"], r["ranks"],
            "in" if r["inplace"] else "out", _num(bus, "base"), _num(bus, "new"), _pct(speed["change_pct"]),
            us(t["base"]["median"]), us(t["new"]["median"]), f"{speed['base']['samples']}/{speed['new']['samples']}",
            "N/A" if r["wrong"]["new"] is None else r["wrong"]["new"], WORDS[r["verdict"]],
            _range(bus, "base"), _range(bus, "new"))
        notes = [] if bus is not None else ["0 bytes: compared by time"]
        if "overhead_pct" in m:
            o = m["overhead_pct"]
            notes.append(f"overhead {o['base']['median']:+.1f}% -> {o['new']['median']:+.1f}% "
                         f"({o['change_points']:+.1f} pt, {WORDS[o['verdict']]})")
        if "ratio" in m:
            o = m["ratio"]
            notes.append(f"ratio {o['base']['median']:.2f} -> {o['new']['median']:.2f} "
                         f"({_pct(o['change_pct'])}, {WORDS[o['verdict']]})")
        lines.append(line.rstrip() + ("  " + "; ".join(notes) if notes else ""))
    return lines


_LINK = "{:>10}  {:>9} {:>9} {:>8}  {:>7} {:>7} {:>8} {:>7}  {:<12}"


def _link_table(rows: list[dict], spread: bool) -> list[str]:
    """report --json files' links: GB/s and the share of time waiting (points), the verdict the worse of the two."""
    fmt = _LINK + ("  {:>17} {:>17}" if spread else "")
    lines = ["#" + fmt.format("link", "base_GB/s", "new_GB/s", "change", "base_w%", "new_w%", "change", "samples",
                              "verdict", "base GB/s range", "new GB/s range")[1:].rstrip()]
    for r in rows:
        m = r["metrics"]
        g, w = m.get("gbps"), m.get("wait_pct")
        lines.append(fmt.format(
            f"{r['src']}->{r['dst']}", _num(g, "base"), _num(g, "new"), _pct(g["change_pct"]) if g else "-",
            _num(w, "base", 1), _num(w, "new", 1), f"{w['change_points']:+.1f}pt" if w else "-",
            "/".join(str((g or w or {}).get(s, {}).get("samples", 0)) for s in ("base", "new")), WORDS[r["verdict"]],
            _range(g, "base"), _range(g, "new")).rstrip())
    return lines


def _num(m: dict | None, side: str, digits: int = 3) -> str:
    return "-" if m is None else f"{m[side]['median']:.{digits}f}"


def _range(m: dict | None, side: str) -> str:
    return "" if m is None else f"{m[side]['min']:.3f}..{m[side]['max']:.3f}"


def _pct(p: float | None) -> str:
    return "N/A" if p is None else f"{p:+.1f}%"


def _summary(res: dict, threshold: float) -> list[str]:
    c = res["counts"]
    line = (f"# {plural(len(res['rows']), 'row')} compared: {c['regression']} regression(s), {c['wrong']} wrong, "
            f"{c['improved']} improved, {c['noise']} within noise, {c['same']} same (within {threshold:g}%); "
            f"{len(res['only_base'])} only in BASE, {len(res['only_new'])} only in NEW")
    if c["wrong_new_only"]:
        line += f" ({c['wrong_new_only']} of them wrong)"
    bad = [w for w, n in (("regression", c["regression"]), ("wrong result", c["wrong"] + c["wrong_new_only"])) if n]
    return [line, f"# FAILED: {' and '.join(bad)} in NEW" if bad else "# OK: no regression"]
