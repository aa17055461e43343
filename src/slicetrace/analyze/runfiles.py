"""One run's trace files read one at a time, through load_files' checks: a caller that keeps far less of a file
than its records (convert) then holds one file's records at a time, not the whole run's."""
from __future__ import annotations

import os
from typing import Callable, Iterable, TypeVar

from .records import read_records, record_problem
from .trace import comm_of, load_files, run_ranks, trace_files
from ..errors import TraceFormatError

T = TypeVar("T")


def load_each(paths: str | os.PathLike | Iterable[str | os.PathLike], command: str,
              take: Callable[[str, list[dict]], T]) -> list[T]:
    """[take(file, records)] for each file of load_files(paths, command), each file's records dropped once taken.
    take sees records that passed record_problem but not yet the checks that need every file (communicators, rank
    bounds, one file per rank): if any of those fails, load_files reads the run again and raises its own error,
    so what is refused, and the message, are load_files'."""
    unique: dict[str, str] = {}
    for p in trace_files(paths):
        unique.setdefault(os.path.realpath(p), p)
    kept: list[T] = []
    brief: list[tuple[str, list[dict]]] = []        # what run_ranks reads: the first pid, slicetrace_comm
    comms, pids = set(), []
    lo, hi = 0, 0
    for f in unique.values():
        recs = read_records(f)
        if not recs or any(map(record_problem, recs)):
            return _whole(paths, command, take)
        first = next((r for r in recs if "pid" in r), None)
        if first is None:
            return _whole(paths, command, take)
        pids.append(first["pid"])
        comms.add(comm_of(f, recs))
        brief.append((f, [r for r in recs if r is first or r.get("name") == "slicetrace_comm"]))
        got = _rank_values(recs)
        if got:
            lo, hi = min(lo, *got), max(hi, *got)
        kept.append(take(f, recs))
        del recs
    try:
        ranks = run_ranks(brief) if len(comms) == 1 else None
    except TraceFormatError:
        return _whole(paths, command, take)
    if len(comms) != 1 or len(set(pids)) != len(pids) or (ranks is not None and not (0 <= lo and hi < ranks.n)):
        return _whole(paths, command, take)
    return kept


def _rank_values(recs: list[dict]) -> set[int]:
    """The distinct values rank_problem bounds: int pids, args.Rank and args.Peer."""
    args = [a for a in (r.get("args") for r in recs) if type(a) is dict]
    got = {r.get("pid") for r in recs} | {a.get("Rank") for a in args} | {a.get("Peer") for a in args}
    return {v for v in got if type(v) is int}


def _whole(paths, command: str, take: Callable[[str, list[dict]], T]) -> list[T]:
    """The slow path: load_files raises what it refuses (a run it accepts is taken as it is)."""
    return [take(f, recs) for f, recs in load_files(paths, command)]
