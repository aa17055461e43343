"""One run's trace files read one at a time, through load_files' checks: a caller that keeps far less of a file
than its records (convert, report) then holds one file's records at a time, not the whole run's."""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, NamedTuple, TypeVar

from .comms import CommFacts, comm_of, file_facts, in_order, merged, warn_apart
from .records import Ranks, read_records, record_problem
from .runranks import run_ranks
from .trace import load_comms, load_files, trace_files
from ..errors import TraceFormatError

T = TypeVar("T")
log = logging.getLogger("slicetrace")


class CommRun(NamedTuple):
    """One communicator's part of load_runs: its facts, its files, take()'s results and its run_ranks."""
    facts: CommFacts
    files: list[str]
    kept: list
    ranks: Ranks | None


def load_each(paths: str | os.PathLike | Iterable[str | os.PathLike], command: str,
              take: Callable[[str, list[dict]], T], skip_empty: bool = False) -> tuple[list[T], Ranks | None]:
    """[take(file, records)] for each file of load_files(paths, command, skip_empty), each file's records dropped
    once taken, and the run's run_ranks. take sees records that passed record_problem but not yet the checks that
    need every file (communicators, rank bounds, one file per rank): if any of those fails, load_files reads the
    run again and raises its own error, so what is refused, and the message, are load_files'."""
    run = load_runs(paths, command, take, skip_empty)[0]
    return run.kept, run.ranks


def load_runs(paths: str | os.PathLike | Iterable[str | os.PathLike], command: str,
              take: Callable[[str, list[dict]], T], skip_empty: bool = False,
              all_comms: bool = False) -> list[CommRun]:
    """load_each as one CommRun; all_comms (--all-comms): files of one or more communicators, one CommRun each,
    each checked as a run of its own, in trace.load_comms' order and with its warning (comms.warn_apart). Facts
    other than the hash are read (a pass over every record) with all_comms only."""
    unique: dict[str, str] = {}
    for p in trace_files(paths):
        unique.setdefault(os.path.realpath(p), p)
    by_comm: dict[str, list[tuple]] = {}        # hash -> per file (file, facts, first pid, brief, lo, hi, taken)
    said = _Drop(0)                 # counts the reads' warnings: load_files' second read says them again

    def whole() -> list[CommRun]:
        return _whole(paths, command, take, skip_empty, said.seen, all_comms)
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
        facts = _facts(f, recs, all_comms)
        got = _rank_values(recs) or {0}
        by_comm.setdefault(facts.comm, []).append((f, facts, first["pid"], [r for r in recs if r is first or r.get(
            "name") == "slicetrace_comm"], min(got), max(got), take(f, recs)))
        del recs
    if not by_comm or (len(by_comm) != 1 and not all_comms):
        return whole()
    runs = []
    for group in by_comm.values():
        try:
            ranks = run_ranks([(g[0], g[3]) for g in group])
        except TraceFormatError:
            return whole()
        pids = [g[2] for g in group]
        lo, hi = min(g[4] for g in group), max(g[5] for g in group)
        if len(set(pids)) != len(pids) or (ranks is not None and not (0 <= lo and hi < ranks.n)):
            return whole()
        runs.append(CommRun(merged([g[1] for g in group]), [g[0] for g in group], [g[6] for g in group], ranks))
    return _ordered(runs, command)


def _facts(f: str, recs: list[dict], all_comms: bool) -> CommFacts:
    """file_facts, a pass over every record, where they are used: one communicator needs its hash alone."""
    return file_facts(f, recs) if all_comms else CommFacts(comm_of(f, recs), None, 0.0, 0.0, 0.0)


def _ordered(runs: list[CommRun], command: str) -> list[CommRun]:
    """Several communicators: in their order, with the warning when their times never overlap (load_comms')."""
    if len(runs) > 1:
        warn_apart([r.facts for r in runs], command, {r.facts.comm: r.files for r in runs})
    return [runs[i] for i in in_order([r.facts for r in runs])]


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
           said: int, all_comms: bool = False) -> list[CommRun]:
    """The slow path: load_files (load_comms) raises what it refuses (a run it accepts is taken as it is). Its first
    `said` warnings were said by load_each's reads of the same files already."""
    with _filtered(_Drop(said)):
        groups = load_comms(paths, command, skip_empty) if all_comms else [load_files(paths, command, skip_empty)]
    return [CommRun(merged([_facts(f, recs, all_comms) for f, recs in g]), [f for f, _ in g],
                    [take(f, recs) for f, recs in g], run_ranks(g)) for g in groups]


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
