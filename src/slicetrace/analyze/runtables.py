"""What `slicetrace report` reads of a run, taken from one file at a time (runfiles.load_each): the KernelStep and
KernelCh tables, counters, op starts and Coll spans, and the facts its checks need, with each file's records
dropped once taken (a run's records as dicts are ~5x its JSON).

Each file's part is what trace's functions give on that file's records alone; joined in file order, the parts
are what they give on the run's records merged, since they pair b and e records (and look up ParentIds) by pid:
files whose b/e records share a pid are instead read again whole, as are files on which a function raises (its
error, and the record index it names, are then the merged records', raised where report asked for that table).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterable, NamedTuple

import numpy as np

from .records import Ranks
from .comms import CommFacts
from .flightwindow import chs_in_window, evicted, spans_in_window, windows
from .runfiles import load_again, load_each, load_runs
from .trace import coll_spans, counters, failures, kernel_chs, kernel_steps, op_names, op_starts, symmetric_ops


class _Failed(NamedTuple):
    error: BaseException


class _Part(NamedTuple):
    paired: set                         # the pids of b and e records: pairs and ParentIds are looked up by them
    present: set                        # int pids
    evented: set                        # int pids of b and X records
    records: int
    ops: int                            # Coll and P2p b records
    one_rank: bool                      # a slicetrace_comm record says nRanks 1
    masks: set                          # the EventMasks its slicetrace_comm records name
    ks: Any                             # each: the function's result, or _Failed
    chs: Any
    counts: Any
    starts: Any
    spans: Any
    names: Any
    failures: Any
    sym: Any
    flight: dict                        # pid -> its slicetrace_flightrec record's args (flightwindow.windows)


def _attempt(fn: Callable[[list[dict]], Any], recs: list[dict]) -> Any:
    try:
        return fn(recs)
    except Exception as e:          # raised again where report asks for it, as report raised it
        return _Failed(e)


def _part(f: str, recs: list[dict]) -> _Part:
    paired, present, evented = set(), set(), set()
    ops, one_rank, masks = 0, False, set()
    for r in recs:
        pid, ph = r.get("pid"), r.get("ph")
        if type(pid) is int:
            present.add(pid)
            if ph in ("b", "X"):
                evented.add(pid)
        if ph in ("b", "e"):
            paired.add(pid)
            ops += ph == "b" and r.get("cat") in ("COLL", "P2P")
        if r.get("name") == "slicetrace_comm":
            a = r.get("args") or {}
            one_rank = one_rank or a.get("nRanks") == 1
            if type(a) is dict and type(a.get("EventMask")) is int:
                masks.add(a["EventMask"])
    return _Part(paired, present, evented, len(recs), ops, one_rank, masks,
                 *(_attempt(fn, recs) for fn in (kernel_steps, kernel_chs, counters, op_starts, coll_spans, op_names,
                                                 failures, symmetric_ops)), windows(recs))


class RunTables:
    """A run's tables for report; ranks: run_ranks of its files; present: its int pids, sorted; evented: those
    with b or X records; records: how many; ops: its Coll and P2p b records; one_rank: a slicetrace_comm record
    says nRanks 1; masks: the EventMasks its slicetrace_comm records name; flight: pid -> its flight record's window
    (flightwindow). steps(), counters(), starts(), spans(), names(), failures(): kernel_steps and kernel_chs,
    counters, op_starts, coll_spans, op_names, failures of the run's records (raising what those raise); of flight
    records, steps() and spans() without the collectives evicted before a rank's window (flightwindow.evicted)."""

    def __init__(self, parts: list[_Part], ranks: Ranks | None) -> None:
        self._parts = parts
        self.ranks = ranks
        self.present = sorted(set().union(*(p.present for p in parts)))
        self.evented = set().union(*(p.evented for p in parts))
        self.records = sum(p.records for p in parts)
        self.ops = sum(p.ops for p in parts)
        self.one_rank = any(p.one_rank for p in parts)
        self.masks = set().union(*(p.masks for p in parts))
        self.flight = _merged([p.flight for p in parts])
        self._gone: set | None = None

    def _got(self, field: str) -> list:
        got = [getattr(p, field) for p in self._parts]
        for g in got:
            if isinstance(g, _Failed):
                raise g.error
        return got

    def _chs(self) -> np.ndarray:
        chs = self._got("chs")
        return chs[0] if len(chs) == 1 else np.concatenate(chs)

    def _spans(self) -> list:
        return [s for got in self._got("spans") for s in got]

    def _evicted(self) -> set:
        """The collectives evicted before a flight record's window (flightwindow.evicted), once."""
        if self._gone is None:
            self._gone = set()
            if self.flight:
                try:
                    self._gone = evicted(self.flight, self._got("chs"), self._spans())    # steps() joins them
                except Exception:       # raised where report asks for that table, as without flight records
                    pass
        return self._gone

    def steps(self) -> tuple[np.ndarray, np.ndarray]:
        ks = self._got("ks")
        return (ks[0] if len(ks) == 1 else np.concatenate(ks)), chs_in_window(self._chs(), self._evicted())

    def counters(self) -> dict:
        return _merged(self._got("counts"))

    def starts(self) -> dict:
        return _merged(self._got("starts"))

    def spans(self) -> list:
        return spans_in_window(self._spans(), self._evicted())

    def names(self) -> dict:
        return _merged(self._got("names"))

    def sym(self) -> set:
        return set().union(*self._got("sym"))

    def failures(self) -> list:
        return sorted((f for got in self._got("failures") for f in got), key=lambda f: (f["ts_ns"], f["rank"]))


def _merged(dicts: list[dict]) -> dict:
    """One dict as the merged records' comprehension gives it: a key's first place, its last value."""
    out: dict = {}
    for d in dicts:
        out.update(d)
    return out


def run_tables(paths: str | os.PathLike | Iterable[str | os.PathLike], skip_empty: bool = False) -> RunTables:
    """RunTables of load_files(paths, "report", skip_empty), reading one file at a time where that gives the same
    tables (the module's doc says when it does not)."""
    return _tables(*load_each(paths, "report", _part, skip_empty), paths, skip_empty)   # no caller holds the parts


def comm_tables(paths: str | os.PathLike | Iterable[str | os.PathLike],
                skip_empty: bool = False) -> list[tuple[CommFacts, RunTables]]:
    """run_tables of each communicator of the files (`report --all-comms`: runfiles.load_runs), in their order:
    each one's tables are those of its files alone."""
    return [(r.facts, _tables(r.kept, r.ranks, r.files, skip_empty))
            for r in load_runs(paths, "report", _part, skip_empty, all_comms=True)]


def _tables(parts: list[_Part], ranks: Ranks | None, paths, skip_empty: bool) -> RunTables:
    seen: set = set()
    for p in parts:
        if seen & p.paired or any(isinstance(v, _Failed) for v in (p.ks, p.chs, p.counts, p.starts, p.spans, p.names,
                                                                   p.failures)):
            break
        seen |= p.paired
    else:
        return RunTables(parts, ranks)
    del parts, p            # a _Failed's traceback holds its file's records
    loaded = load_again(paths, "report", skip_empty)      # the files load_each read: their ranks
    return RunTables([_part(loaded[0][0], [r for _, recs in loaded for r in recs])], ranks)
