"""One run's trace files read one at a time, through load_files' checks: a caller that keeps far less of a file
than its records (convert, report) then holds one file's records at a time, not the whole run's."""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, TypeVar

from .records import Ranks, read_records, record_problem
from .runranks import run_ranks
from .trace import comm_of, load_files, trace_files
from ..errors import TraceFormatError

T = TypeVar("T")
log = logging.getLogger("slicetrace")


def load_each(paths: str | os.PathLike | Iterable[str | os.PathLike], command: str,
              take: Callable[[str, list[dict]], T], skip_empty: bool = False) -> tuple[list[T], Ranks | None]:
    """[take(file, records)] for each file of load_files(paths, command, skip_empty), each file's records dropped
    once taken, and the run's run_ranks. take sees records that passed record_problem but not yet the checks that
    need every file (communicators, rank bounds, one file per rank): if any of those fails, load_files reads the
    run again and raises its own error, so what is refused, and the message, are load_files'."""
    unique: dict[str, str] = {}
    for p in trace_files(paths):
        unique.setdefault(os.path.realpath(p), p)
    kept: list[T] = []
    brief: list[tuple[str, list[dict]]] = []        # what run_ranks reads: the first pid, slicetrace_comm
    comms, pids = set(), []
    lo, hi = 0, 0
    said = _Drop(0)                 # counts the reads' warnings: load_files' second read says them again

    def whole() -> tuple[list[T], Ranks | None]:
        return _whole(paths, command, take, skip_empty, said.seen)
    for f in unique.values():
        with _filtered(said):
            recs = read_records(f, empty_ok=skip_empty)
            if not recs and skip_empty:
                log.warning("slicetrace: %r holds no records: left out", f)     # as load_files says it
                continue
        if not recs or any(map(record_problem, recs)):
            return whole()
        first = next((r for r in recs if "pid" in r), None)
        if first is None:
            return whole()
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
        return whole()
    if len(comms) != 1 or len(set(pids)) != len(pids) or (ranks is not None and not (0 <= lo and hi < ranks.n)):
        return whole()
    return kept, ranks


def load_again(paths: str | os.PathLike | Iterable[str | os.PathLike], command: str,
               skip_empty: bool = False) -> list[tuple[str, list[dict]]]:
    """load_files of a run that load_each has read and accepted: for a caller that needs every record at once
    after all (rare inputs), without saying the reads' warnings twice."""
    with _filtered(_Drop(None)):
        return load_files(paths, command, skip_empty)


def _rank_values(recs: list[dict]) -> set[int]:
    """The distinct values rank_problem bounds: int pids, args.Rank and args.Peer."""
    args = [a for a in (r.get("args") for r in recs) if type(a) is dict]
    got = {r.get("pid") for r in recs} | {a.get("Rank") for a in args} | {a.get("Peer") for a in args}
    return {v for v in got if type(v) is int}


def _whole(paths, command: str, take: Callable[[str, list[dict]], T], skip_empty: bool,
           said: int) -> tuple[list[T], Ranks | None]:
    """The slow path: load_files raises what it refuses (a run it accepts is taken as it is). Its first `said`
    warnings were said by load_each's reads of the same files already."""
    with _filtered(_Drop(said)):
        loaded = load_files(paths, command, skip_empty)
    return [take(f, recs) for f, recs in loaded], run_ranks(loaded)


class _Drop(logging.Filter):
    """Drops the first `drop` records (None: all) and counts those it sees."""
    def __init__(self, drop: int | None) -> None:
        super().__init__()
        self.drop, self.seen = drop, 0

    def filter(self, record: logging.LogRecord) -> bool:
        self.seen += 1
        return self.drop is not None and self.seen > self.drop


@contextmanager
def _filtered(f: logging.Filter) -> Iterator[None]:
    log.addFilter(f)
    try:
        yield
    finally:
        log.removeFilter(f)
