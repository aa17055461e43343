"""A run's rank count, from its trace's slicetrace_comm records or its rank files' names, and the ranks its files
lack: what load_files checks Rank, Peer and pid against, and report and convert refuse without --partial."""
from __future__ import annotations

import glob
import os
import re

from ..errors import TraceFormatError
from .records import _I32, Ranks

_RANK_FILE = re.compile(r"^(.*_\d+)_(\d+)\.json$")      # <prefix>_<commHash>_<rank>.json


def run_ranks(loaded: list[tuple[str, list[dict]]]) -> Ranks | None:
    """The run's rank count: a "slicetrace_comm" metadata record's nRanks, else one past the highest rank among
    its rank files (<prefix>_<commHash>_<rank>.json on disk beside the files given; the pid of a file not named
    so), when that makes 2 or more ranks; else None (one rank's file alone tells nothing about its peers)."""
    meta = [(f, r["args"]["nRanks"]) for f, recs in loaded for r in recs
            if r.get("name") == "slicetrace_comm" and type(r.get("args")) is dict and "nRanks" in r["args"]]
    if meta:
        counts = {n for _, n in meta if type(n) is int and 1 <= n <= _I32}
        if len(counts) != 1 or len(meta) != sum(type(n) is int and 1 <= n <= _I32 for _, n in meta):
            said = ", ".join(f"{f!r}: {n!r}" for f, n in meta)
            raise TraceFormatError(f"the slicetrace_comm records' nRanks ({said}): accepted one integer >= 1, the "
                                   f"same in every file of the run, at most {_I32} (ranks are int32)")
        return Ranks(counts.pop(), "nRanks of the trace's slicetrace_comm record")
    ranks, prefixes = set(), set()
    for f, recs in loaded:
        m = _RANK_FILE.match(f)
        if m:
            prefixes.add(m.group(1))
            for g in glob.glob(glob.escape(m.group(1)) + "_*.json"):
                mg = _RANK_FILE.match(g)
                if mg and mg.group(1) == m.group(1):
                    if int(mg.group(2)) > _I32:         # a run of that many ranks is a bad name, not a run
                        raise TraceFormatError(f"trace file {g!r}: the rank in its name, {mg.group(2)}, is not one: "
                                               f"accepted 0..{_I32} (<prefix>_<commHash>_<rank>.json)")
                    ranks.add(int(mg.group(2)))
            continue
        pid = next((r["pid"] for r in recs if "pid" in r), None)      # a file not named by its rank: its pid
        if type(pid) is int and 0 <= pid <= _I32:          # other pids are record_problem's to name
            ranks.add(pid)
    if len(ranks) < 2:
        return None
    where = ", ".join(sorted(f"{os.path.relpath(p)}_<rank>.json" for p in prefixes)) or "the files given (pids)"
    return Ranks(max(ranks) + 1, f"{len(ranks)} rank files, the highest rank {max(ranks)}, of {where}; the trace "
                                 f"does not record the rank count")


def absent(ranks: Ranks, present: set, shown: int = 20) -> tuple[int, str]:
    """(how many of the run's ranks have no records, the first `shown` of them as text): counted, not listed in
    full, as a trace may claim billions of ranks."""
    have = sum(type(r) is int and 0 <= r < ranks.n for r in present)
    first: list[int] = []
    r = 0
    while len(first) < min(shown, ranks.n - have):     # ends within len(present) + shown steps
        if r not in present:
            first.append(r)
        r += 1
    more = ranks.n - have - len(first)
    return ranks.n - have, f"{first}" + (f" and {more:,} more" if more else "")


def every_rank(where: str, ranks: Ranks | None, present: set, partial: bool) -> str:
    """The check report and convert make of a run's files: a rank of the run with no records would be left out
    silently (a straggler whose file is missing never named, another rank in its place), so it is refused
    (TraceFormatError) unless `partial` (--partial); then '' when every rank is there, else what --partial left
    out, for the caller's note. where: the files given, for the message."""
    missing, listed = absent(ranks, present) if ranks else (0, "")
    if missing and not partial:
        raise TraceFormatError(f"{where}: the run had {ranks.n} ranks ({ranks.source}) and the files given hold no "
                               f"records of rank(s) {listed}; give every rank's file, or pass --partial to go on "
                               f"with the ranks present")
    return f"rank(s) {listed} of {ranks.n} absent" if missing else ""
