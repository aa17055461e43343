"""Two sets of `slicetrace bench --json` runs, row by row: what got slower, by how much, and whether beyond noise;
or two sets of `slicetrace report --json` files, link by link (busbw and the share of time spent waiting).

Pure functions over the files' JSON (`slicetrace diff` prints and exits); nothing here runs a collective.
"""
from __future__ import annotations

import glob
import json
import math
import os
import statistics
from dataclasses import dataclass, field

from ..errors import UsageError

KEY = ("backend", "op", "size", "type", "redop", "inplace", "root", "ranks")    # a row's identity across runs
LINK_KEY = ("src", "dst")           # a report's link: ranks, not the communicator's hash, so runs compare
ACCEPTED = ("files written by `slicetrace bench --json FILE` (or all by `slicetrace report --json FILE`), a folder "
            "of them, or a glob")
MIN_SPREAD_SAMPLES = 3      # below this on either side a [min, max] range says nothing about noise
# what makes two runs' numbers comparable, as the messages name them; sweep bounds (-b -e -d -o --op) only choose rows
BENCH_FLAGS = {"iters": "-n", "warmup_iters": "-w", "check": "-c", "average": "-a", "inplace": "--inplace",
               "overhead": "--overhead", "overhead_of": "--overhead-of", "rounds": "--rounds",
               "compare": "--compare", "seed": "--seed", "profile": "--profile"}
# settings that do not change what is measured: where files go, how long a wait may take, log level
IGNORED_SETTINGS = {"cache_dir", "timeout_s", "debug", "profile_dump_file", "linkstats_file"}
ENV_KEYS = ("host", "cpu_model", "cpus", "gpus", "slicetrace", "python", "numpy", "cupy", "torch", "nccl")
ROW_FIELDS = ("op", "size", "type", "busbw", "time_us")


@dataclass
class Side:
    """One side (BASE or NEW): its files' rows pooled."""
    name: str
    kind: str                                   # "bench" or "report": which command wrote the files
    files: list[str]
    rows: list[dict]                            # each row with its file's backend and ranks filled in
    setups: list[dict]                          # per file: comparable setting -> value
    envs: list[dict]                            # per file: env key -> value
    incomplete: list[str] = field(default_factory=list)     # "file: why" for runs that died


def expand(spec: str, name: str) -> list[str]:
    """A file, a folder (its *.json files) or a glob -> the files, sorted; none is a UsageError naming spec."""
    if os.path.isdir(spec):
        files = sorted(glob.glob(os.path.join(glob.escape(spec), "*.json")))
        if not files:
            raise UsageError(f"{name} {spec!r} is a folder without *.json files; give {ACCEPTED}")
        return files
    if os.path.exists(spec):
        return [spec]
    files = sorted(f for f in glob.glob(spec) if os.path.isfile(f))
    if not files:
        raise UsageError(f"{name} {spec!r}: no such file, folder, or files matching it as a glob; give {ACCEPTED}")
    return files


def _read(path: str, name: str) -> tuple[str, dict]:
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except OSError as e:
        raise UsageError(f"{name} {path!r}: cannot read it ({e.strerror or e}); give {ACCEPTED}") from None
    except ValueError as e:         # JSONDecodeError, and bytes that are not UTF-8
        raise UsageError(f"{name} {path!r} is not JSON ({e}); give {ACCEPTED}") from None
    if isinstance(d, dict) and isinstance(d.get("rows"), list) and isinstance(d.get("settings"), dict) \
            and isinstance(d.get("bench"), dict):
        return "bench", d
    if isinstance(d, dict) and isinstance(d.get("links"), list) and "stragglers" in d:
        return "report", d
    events = d if isinstance(d, list) else d.get("traceEvents") if isinstance(d, dict) else None
    what = ("a Chrome trace" if isinstance(events, list) and all(isinstance(e, dict) for e in events[:1]) else
            f"JSON with keys {sorted(d)[:8]}" if isinstance(d, dict) else f"a JSON {type(d).__name__}")
    raise UsageError(f"{name} {path!r} is {what}, not a bench result (keys settings, bench, rows) nor a report's "
                     f"(keys links, stragglers, ...); give {ACCEPTED}")


def load_side(spec: str, name: str) -> Side:
    """BASE or NEW as given: every file's rows, checked to have what a comparison reads."""
    files = expand(spec, name)
    read = [(path, *_read(path, name)) for path in files]
    side = Side(name, read[0][1], files, [], [], [])
    for path, kind, d in read:
        if kind != side.kind:
            raise UsageError(f"{name} {path!r} is a {kind} --json file, {files[0]!r} a {side.kind} --json file: "
                             f"a side's files pool, so they must all be of one kind")
        if kind == "report":
            side.rows += link_rows(d, path, name)
            side.setups.append({"ranks": len(d.get("ranks") or [])})
            continue
        backend, ranks = d["settings"].get("backend"), d.get("ranks")
        for i, r in enumerate(d["rows"]):
            missing = [k for k in ROW_FIELDS if not isinstance(r, dict) or k not in r]
            if missing:
                raise UsageError(f"{name} {path!r}: row {i} lacks {missing} (a bench row has {list(ROW_FIELDS)}); "
                                 f"give {ACCEPTED}")
            _numbers(r, ("busbw", "time_us"), (), f"{name} {path!r}: row {i}")   # null: bench writes NaN so
            side.rows.append({"backend": backend, "ranks": ranks, "redop": "none", "inplace": False, "root": -1,
                              **r})
        side.setups.append(setup(d))
        side.envs.append({k: d.get("env", {}).get(k) for k in ENV_KEYS if k in d.get("env", {})})
        if not d.get("complete", True):
            side.incomplete.append(f"{path}: {d.get('incomplete', 'incomplete')} ({len(d['rows'])} row(s))")
    return side


def link_rows(d: dict, path: str, name: str) -> list[dict]:
    """A report's links as rows: GB/s (the link's bytes over its busy time) and wait_pct, the share of the link's
    time (summed over channels, both ends) spent waiting: credit waits of its sender, data waits of its receiver."""
    rows = []
    for i, ln in enumerate(d["links"]):
        if not isinstance(ln, dict) or any(k not in ln for k in ("src", "dst", "gbps", "send_transfer_us")):
            raise UsageError(f"{name} {path!r}: links[{i}] lacks src, dst, gbps or send_transfer_us; give {ACCEPTED}")
        _numbers(ln, ("send_transfer_us",), ("gbps", "send_credit_wait_us", "recv_data_wait_us"),
                 f"{name} {path!r}: links[{i}]")
        wait = (ln.get("send_credit_wait_us") or 0.0) + (ln.get("recv_data_wait_us") or 0.0)
        total = wait + ln["send_transfer_us"]
        rows.append({"src": ln["src"], "dst": ln["dst"], "gbps": ln["gbps"],
                     "wait_pct": wait / total * 100 if total > 0 else None})
    return rows


def _numbers(d: dict, keys: tuple[str, ...], nullable: tuple[str, ...], where: str) -> None:
    """A row's or link's numbers: finite and >= 0 (null too for `nullable`, as report writes a link it cannot
    time); else a UsageError naming it: a speed of nothing cannot be compared."""
    for k in keys + nullable:
        v = d.get(k)
        if not (v is None and k in nullable or type(v) in (int, float) and math.isfinite(v) and v >= 0):
            raise UsageError(f"{where} has {k} {v!r}; a number >= 0{' or null' if k in nullable else ''} is "
                             f"accepted")


def setup(d: dict) -> dict:
    """What a fair comparison needs equal, as 'name': value with the names messages use."""
    out = {"ranks": d.get("ranks")}
    out.update({f"settings.{k}": json.dumps(v, sort_keys=True) if isinstance(v, dict) else v
                for k, v in sorted(d["settings"].items()) if k not in IGNORED_SETTINGS})
    out.update({f"{flag} ({k})": d["bench"].get(k) for k, flag in BENCH_FLAGS.items() if k in d["bench"]})
    prof = d.get("profiling") or {}
    out.update({f"profiling.{k}": prof.get(k) for k in ("plugins", "event_mask", "main_profiled") if k in prof})
    return out


def differences(base: list[dict], new: list[dict]) -> list[str]:
    """'name a -> b' per key whose values differ between the sides (each side's values: those of its files)."""
    out = []
    for k in sorted(set().union(*base, *new)):
        a, b = _values(base, k), _values(new, k)
        if a != b:
            out.append(f"{k} {a} -> {b}")
    return out


def within(side: list[dict]) -> list[str]:
    """'name a, b' per key whose values differ among one side's files (pooled rows of unlike runs)."""
    return [f"{k} {_values(side, k)}" for k in sorted(set().union(*side)) if len({_text(s.get(k)) for s in side}) > 1]


def _text(v) -> str:
    return "unset" if v is None else json.dumps(v) if isinstance(v, list) else str(v)


def _values(setups: list[dict], k: str) -> str:
    vals = list(dict.fromkeys(_text(s.get(k)) for s in setups))
    return vals[0] if len(vals) == 1 else "{" + ", ".join(vals) + "}"


@dataclass(frozen=True)
class Stats:
    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, xs: list[float]) -> Stats | None:
        xs = [float(x) for x in xs if x is not None]
        return cls(statistics.median(xs), min(xs), max(xs), len(xs)) if xs else None

    def to_dict(self) -> dict:
        return {"median": self.median, "min": self.lo, "max": self.hi, "samples": self.n}


def spread_known(base: Stats, new: Stats) -> bool:
    return base.n >= MIN_SPREAD_SAMPLES and new.n >= MIN_SPREAD_SAMPLES


def overlap(base: Stats, new: Stats) -> bool:
    return base.lo <= new.hi and new.lo <= base.hi


def verdict(base: Stats, new: Stats, threshold: float, higher_better: bool = True, points: bool = False) -> str:
    """'regression' / 'improved' when NEW's median is beyond threshold (a fraction of BASE's median, or absolute
    points with points=True) in the bad / good direction and, where both sides have >= 3 samples, their ranges do
    not overlap ('noise' when they do); else 'same'. From a BASE median of 0, any change is beyond a fraction."""
    delta = new.median - base.median
    if abs(delta) <= (threshold * 100 if points else threshold * abs(base.median)):
        return "same"
    if spread_known(base, new) and overlap(base, new):
        return "noise"
    return "improved" if (delta > 0) == higher_better else "regression"


def change_pct(base: Stats, new: Stats) -> float | None:
    return (new.median / base.median - 1) * 100 if base.median else None


def _group(rows: list[dict], key: tuple[str, ...]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault(tuple(r.get(k) for k in key), []).append(r)
    return out


def _order(key: tuple) -> tuple:
    """As bench prints them: by op, type, reduction, ..., then size; values of a kind compare as text or number."""
    k = dict(zip(KEY, key))
    return tuple(str(k[f]) for f in ("backend", "op", "type", "redop", "inplace")) + tuple(
        k[f] if isinstance(k[f], int) else -1 for f in ("root", "ranks", "size"))


# row verdicts, worst first: the row's verdict is its metrics' worst
ORDER = ("wrong", "regression", "noise", "improved", "same")


def compare_rows(base: list[dict], new: list[dict], threshold: float, kind: str = "bench") -> dict:
    """Rows matched by KEY (links by LINK_KEY), each with per-metric numbers and verdicts; rows only on one side
    listed by key."""
    key_of, order = (KEY, _order) if kind == "bench" else (LINK_KEY, None)
    b, n = _group(base, key_of), _group(new, key_of)
    rows = []
    for key in sorted(b.keys() & n.keys(), key=order):
        rows.append(compare_one(dict(zip(key_of, key)), b[key], n[key], threshold, kind))
    only = {side: [dict(zip(key_of, k)) | {"samples": len(g[k]), "wrong": _wrong(g[k])}
                   for k in sorted(g.keys() - other.keys(), key=order)]
            for side, g, other in (("base", b, n), ("new", n, b))}
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ORDER}
    counts["wrong_new_only"] = sum((r["wrong"] or 0) > 0 for r in only["new"])    # a new row's wrong result fails too
    return {"rows": rows, "only_base": only["base"], "only_new": only["new"], "counts": counts,
            "failed": counts["wrong"] + counts["regression"] + counts["wrong_new_only"] > 0}


def _wrong(rows: list[dict]) -> int | None:
    """The wrong values over the samples; None when none was checked (-c 0)."""
    return None if all(r.get("wrong") is None for r in rows) else sum(r.get("wrong") or 0 for r in rows)


def compare_one(key: dict, base: list[dict], new: list[dict], threshold: float, kind: str = "bench") -> dict:
    """One key's samples on each side -> medians, ranges, changes and verdicts of busbw (time for 0 bytes, whose
    busbw is 0), the profiling overhead, the --compare ratio and the wrong-value counts; of a link, its GB/s and
    wait share (points)."""
    out = dict(key)
    metrics = {}
    speed = "gbps" if kind == "report" else "busbw" if any(r["busbw"] for r in base) else "time_us"
    specs = (((speed, True, False), ("wait_pct", False, True)) if kind == "report" else
             ((speed, speed == "busbw", False), ("overhead_pct", False, True), ("ratio", True, False)))
    for m, higher, points in specs:
        sb, sn = Stats.of([r.get(m) for r in base]), Stats.of([r.get(m) for r in new])
        if sb is None or sn is None:
            continue
        change = ("change_points", sn.median - sb.median) if points else ("change_pct", change_pct(sb, sn))
        metrics[m] = {"base": sb.to_dict(), "new": sn.to_dict(), "verdict": verdict(sb, sn, threshold, higher, points),
                      change[0]: change[1]}
    if kind == "bench" and speed == "busbw":        # the time too, for the table (busbw's verdict stands for both)
        sb, sn = Stats.of([r["time_us"] for r in base]), Stats.of([r["time_us"] for r in new])
        metrics["time_us"] = {"base": sb.to_dict(), "new": sn.to_dict(), "change_pct": change_pct(sb, sn)}
    wrong = {"base": _wrong(base), "new": _wrong(new)}
    out.update(metrics=metrics, wrong=wrong, speed_metric=speed)
    verdicts = [v["verdict"] for v in metrics.values() if "verdict" in v]
    out["verdict"] = "wrong" if (wrong["new"] or 0) > 0 else min(verdicts, key=ORDER.index, default="same")
    return out
