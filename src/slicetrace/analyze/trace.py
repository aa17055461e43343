"""Per-rank Chrome-trace files -> records, invariant checks and a KernelStep table (numpy only).

`check_trace` returns the problems it finds (empty list = clean): the file parses as a JSON array of objects;
every async "b" has one "e" with the same pid + cat + id (and name), not earlier; the arg names of the NCCL
example plugin are present; every KernelStep lies inside its Coll/P2p (by ParentId, else any op of the same
rank, when the trace's mask recorded ops) and inside a KernelCh of the same op and channel (a channel without one
is fine only in an op its trace says did not finish: _unfinished, e.g. its "e" record's UnfinishedKernelCh).
`kernel_steps` turns KernelStep records into a structured array for causality and traffic checks. `load_files` /
`load_run` read one run's files (as analyze/trace_paths.py's trace_files finds them) for report and convert alike,
refusing what the analyses cannot use (analyze/records.py says what a record may hold).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Iterable

import numpy as np

from ..errors import TraceFormatError
from .comms import ALL_COMMS, POOLED, comm_of, pid_comms, file_facts, in_order, merged, picks, warn_apart
from .flightwindow import windows
from .records import FAILURE_CAT, REQUIRED_ARGS, STEP_ARGS, rank_problem, read_records as _read, record_problem
from .runranks import run_ranks
from .trace_paths import trace_files

KERNEL_STEP_TABLE = np.dtype([
    ("rank", "<i4"), ("channel", "<i4"), ("is_send", "u1"), ("peer", "<i4"), ("step", "<i8"), ("size", "<i8"),
    ("wait_ns", "<i8"), ("ready_ns", "<i8"), ("done_ns", "<i8"), ("seq_number", "<i8"), ("op", "<i8"),
])
KERNEL_CH_TABLE = np.dtype([
    ("rank", "<i4"), ("channel", "<i4"), ("seq_number", "<i8"), ("func", "U24"), ("start_ns", "<i8"),
    ("stop_ns", "<i8"),
])
log = logging.getLogger("slicetrace")
_EPS_US = 1e-3      # ts are written with 3 decimals (exact ns); allow one ns of float noise
# the example plugin's arg on an op's "e" record: it ended this many KernelCh short (sinks/chrome_text.py's name)
UNFINISHED_KCH = "UnfinishedKernelCh"


def _refuse(path: str, i: int, r: dict, problem: str) -> TraceFormatError:
    name = f" ({r['name']})" if isinstance(r.get("name"), str) else ""
    return TraceFormatError(f"trace file {path!r}, record {i}{name}: {problem}")


def load_trace(path: str | os.PathLike, validate: bool = True) -> list[dict]:
    """One trace file as a list of records; TraceFormatError if it is not a JSON array of objects, or (validate)
    if it fails the checks of load_files (which also read the rank count of its run's files on disk)."""
    p = os.fspath(path)
    return _checked([p])[0][0][1] if validate else _read(p)


def load_files(paths: str | os.PathLike | Iterable[str | os.PathLike],
               command: str = "report", skip_empty: bool = False) -> list[tuple[str, list[dict]]]:
    """(file, records) for each file of one run, as trace_files takes them: what report and convert read, through
    the same checks. Refused (TraceFormatError, naming the file, and the record's index and field): a file that
    is not a JSON array of objects or holds no record (its rank would be silently left out), a record that fails
    record_problem, a pid, Rank or Peer past the run's rank count (run_ranks), files of more than one communicator
    (two runs in one folder, which would pool different runs: the message names the prefix of each, for
    `slicetrace <command>`, and --all-comms), and one rank's file twice. skip_empty: files without records are left
    out (with a warning) instead, for an analysis of the ranks present (report's and convert's --partial)."""
    return _checked(_unique(paths), command, skip_empty)[0]


def load_comms(paths: str | os.PathLike | Iterable[str | os.PathLike], command: str = "report",
               skip_empty: bool = False) -> list[list[tuple[str, list[dict]]]]:
    """load_files for files of several communicators (--all-comms): each communicator's files, checked as one run,
    communicators in the order of their first op (comms.in_order); a warning when their times never overlap
    (comms.warn_apart)."""
    return _checked(_unique(paths), command, skip_empty, all_comms=True)


def _unique(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    unique: dict[str, str] = {}
    for p in trace_files(paths):
        unique.setdefault(os.path.realpath(p), p)     # one file named twice (a folder and its file) counts once
    return list(unique.values())


def _checked(files: list[str], command: str = "report", skip_empty: bool = False,
             all_comms: bool = False) -> list[list[tuple[str, list[dict]]]]:
    loaded = []
    for f in files:
        recs = _read(f, empty_ok=skip_empty)
        if not recs and skip_empty:
            log.warning("slicetrace: %r holds no records: left out", f)
            continue
        if not recs:
            raise TraceFormatError(f"trace file {f!r} holds no records: its rank's profiler wrote nothing, and "
                                   f"analysing the run without it would silently leave that rank out; pass "
                                   f"--partial if that is what you want")
        loaded.append((f, recs))
    if not loaded:
        raise TraceFormatError(f"none of the {len(files)} trace file(s) holds a record")
    by_comm: dict[str, list[tuple[str, list[dict]]]] = {}          # commHash -> its files
    for f, recs in loaded:
        by_comm.setdefault(comm_of(f, recs), []).append((f, recs))
    if len(by_comm) > 1 and not all_comms:          # first: two runs' rank counts would read as a bad nRanks
        raise TraceFormatError(f"the trace files hold {len(by_comm)} communicators (runs), which one {command} does "
                               f"not pool; {command} one at a time: {picks(by_comm, command)}; or, if they are one "
                               f"job's communicators, pass {ALL_COMMS} to {POOLED.get(command, 'read them all')}")
    for group in by_comm.values():
        _check_run(group)
    if len(by_comm) == 1:
        return list(by_comm.values())
    facts = [merged([file_facts(f, recs) for f, recs in g]) for g in by_comm.values()]
    warn_apart(facts, command, {c: [f for f, _ in g] for c, g in by_comm.items()})
    groups = list(by_comm.values())
    return [groups[i] for i in in_order(facts)]


def _check_run(loaded: list[tuple[str, list[dict]]]) -> None:
    """One communicator's files: rank bounds (run_ranks), record_problem, a pid in each, one file per rank."""
    ranks = run_ranks(loaded)
    seen: dict[object, str] = {}
    for f, recs in loaded:
        for i, r in enumerate(recs):
            problem = (ranks and rank_problem(r, ranks)) or record_problem(r)
            if problem:
                raise _refuse(f, i, r, problem)
        rank = next((r["pid"] for r in recs if "pid" in r), None)
        if rank is None:                # what the name says cannot be checked: a JSON array, not a rank's trace
            raise TraceFormatError(f"trace file {f!r}: none of its {len(recs)} record(s) has a pid (a rank), so it "
                                   f"is no rank's trace; leave it out")
        if rank in seen:
            raise TraceFormatError(f"{seen[rank]!r} and {f!r} are both rank {rank} of commHash {comm_of(f, recs)}; "
                                   f"pass one of them")
        seen[rank] = f


def load_run(paths: str | os.PathLike | Iterable[str | os.PathLike], command: str = "report") -> list[dict]:
    """load_files' records, merged: for the analyses that key ranks by pid."""
    return [r for _, recs in load_files(paths, command) for r in recs]


def load_traces(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[dict]:
    """Many per-rank files (as trace_files takes them) merged, each checked as load_trace checks it."""
    out: list[dict] = []
    for f in trace_files(paths):
        out.extend(load_trace(f))
    return out


def counters(records: list[dict]) -> dict[int, dict[str, int]]:
    """The "slicetrace_counters" metadata of each rank (pid)."""
    return {r.get("pid", 0): dict(r.get("args") or {}) for r in records if r.get("name") == "slicetrace_counters"}


def failures(records: list[dict]) -> list[dict]:
    """The failures the example plugin wrote (an "ERROR" instant where an op of its rank raised), in time order:
    rank, ts_ns, name (the instant's: the error class and its message's first line), error (the class), message,
    the op and seq that raised it, and its communicator (its rank's CommHash in the records; None where not known:
    the instant has none, and a rank's pid is the same in two communicators' files)."""
    comm = pid_comms(records)
    out = []
    for r in records:
        if r.get("ph") == "i" and r.get("cat") == FAILURE_CAT:
            a = r.get("args") or {}
            out.append({"rank": int(r.get("pid") or 0), "ts_ns": round(float(r["ts"]) * 1000),
                        "name": r.get("name") or a.get("Error", ""),        # report prints it: never None
                        "error": a.get("Error", ""), "message": a.get("Message", ""), "op": a.get("Op"),
                        "seq": a.get("SeqNum"), "comm": comm.get(r.get("pid"))})
    return sorted(out, key=lambda f: (f["ts_ns"], f["rank"]))


def _end_us(r: dict) -> float:
    return float(r["ts"]) + float(r.get("dur", 0))


def _pairs(records: list[dict], problems: list[str]) -> dict[tuple, tuple[dict, float]]:
    """(pid, cat, id) -> (b record, e ts) for every matched async pair; mismatches go to problems."""
    opened: dict[tuple, list[dict]] = {}
    done: dict[tuple, tuple[dict, float]] = {}
    ends: dict[tuple, list[dict]] = {}
    for r in records:
        ph = r.get("ph")
        if ph in ("b", "e"):
            key = (r.get("pid"), r.get("cat"), r.get("id"))
            (opened if ph == "b" else ends).setdefault(key, []).append(r)
    for key, bs in opened.items():
        es = ends.pop(key, [])
        if len(bs) != 1 or len(es) != 1:
            problems.append(f"async id {key}: {len(bs)} 'b' and {len(es)} 'e' records (need exactly one each)")
            continue
        b, e = bs[0], es[0]
        if b.get("name") != e.get("name"):
            problems.append(f"async id {key}: 'b' name {b.get('name')!r} != 'e' name {e.get('name')!r}")
        if float(e["ts"]) + _EPS_US < float(b["ts"]):
            problems.append(f"async id {key} ({b.get('name')}): ends at {e['ts']} before it begins at {b['ts']}")
        done[key] = (b, float(e["ts"]))
    for key, es in ends.items():
        problems.append(f"async id {key}: {len(es)} 'e' record(s) without a 'b'")
    return done


def check_trace(path_or_records: str | os.PathLike | list[dict]) -> list[str]:
    """Problems found in one trace (a path or loaded records); [] means every invariant holds. A file cut short is
    one (its records read are checked too)."""
    problems: list[str] = []
    if isinstance(path_or_records, (str, os.PathLike)):
        try:
            records = _read(os.fspath(path_or_records), cut=problems)
        except TraceFormatError as e:
            return [str(e)]
    else:
        records = [r for r in path_or_records if r]
    cut = len(problems)
    for i, r in enumerate(records):
        if "ph" not in r or "name" not in r:
            problems.append(f"record {i} has no 'ph' or 'name': {r}")
        elif r["ph"] in ("b", "e", "X", "i") and not isinstance(r.get("ts"), (int, float)):
            problems.append(f"record {i} ({r['name']}) has no numeric 'ts'")
        else:                               # wrong types would break the checks below
            problem = record_problem(r, need_args=False)
            if problem:
                problems.append(f"record {i} ({r['name']}): {problem}")
    if len(problems) > cut:
        return problems
    pairs = _pairs(records, problems)
    ops: dict[tuple, tuple[float, float]] = {}              # (pid, op id) -> interval
    chans: dict[tuple, list[tuple[float, float]]] = {}      # (pid, op id, channel) -> KernelCh intervals
    for (pid, cat, eid), (b, e_ts) in pairs.items():
        args = b.get("args") or {}
        for (c, name), need in REQUIRED_ARGS.items():
            if cat == c and (name is None or b.get("name") == name):
                missing = [a for a in need if a not in args]
                if missing:
                    problems.append(f"{b['name']} ({cat}, id {eid}) lacks args {missing}")
        if cat in ("COLL", "P2P"):
            ops[(pid, eid)] = (float(b["ts"]), e_ts)
        elif cat == "GPU" and b.get("name") == "KernelCh":
            chans.setdefault((pid, args.get("ParentId"), args.get("Channel")), []).append((float(b["ts"]), e_ts))
    ops_with_kch = {(pid, op) for pid, op, _ in chans} - _unfinished(records, pairs)
    by_rank: dict[Any, list[tuple[float, float]]] = {}
    for (pid, _), iv in ops.items():
        by_rank.setdefault(pid, []).append(iv)
    unparented = _without_ops(records, by_rank)
    for r in records:
        if r.get("name") != "KernelStep" or r.get("ph") != "X":
            continue
        args = r.get("args") or {}
        missing = [a for a in STEP_ARGS if a not in args]
        if missing:
            problems.append(f"KernelStep at ts {r['ts']} lacks args {missing}")
            continue
        t0, t1, pid, parent = float(r["ts"]), _end_us(r), r.get("pid"), args.get("ParentId")
        where = f"KernelStep rank {pid} ch {args['Channel']} step {args['Step']} [{t0}, {t1}]"
        if parent is not None and parent >= 0:
            iv = ops.get((pid, parent))
            if iv is None:
                problems.append(f"{where}: parent op {parent} is not in the trace")
            elif not (iv[0] - _EPS_US <= t0 and t1 <= iv[1] + _EPS_US):
                problems.append(f"{where}: outside its op {parent} [{iv[0]}, {iv[1]}]")
            kch = chans.get((pid, parent, args["Channel"]))
            if kch is None and (pid, parent) in ops_with_kch:
                problems.append(f"{where}: its op {parent} has no KernelCh on channel {args['Channel']}")
            elif kch is not None and not any(a - _EPS_US <= t0 and t1 <= b + _EPS_US for a, b in kch):
                problems.append(f"{where}: outside every KernelCh of op {parent} channel {args['Channel']}")
        elif pid not in unparented and not any(a - _EPS_US <= t0 and t1 <= b + _EPS_US
                                               for a, b in by_rank.get(pid, [])):
            problems.append(f"{where}: inside no Coll/P2p of its rank")
    return problems


def _unfinished(records: list[dict], pairs: dict) -> set[tuple]:
    """(pid, op id) of the ops their trace says did not finish, so a channel of theirs may have KernelSteps and no
    KernelCh (its program never ended): an op whose "e" record carries UNFINISHED_KCH (the example plugin's mark,
    from the host's event_unfinished: a failed P2p, an op cut short without an error), a Coll named by an ERROR
    instant of its rank (Op and SeqNum: the op that raised), or any op named by its rank's flight record's
    Unfinished list (Op and SeqNum, or ToPeer for a P2p). Not the counters' missing_kernel_ch: a rank-wide count
    says nothing of which op it was."""
    marked = {(r.get("pid"), r.get("cat"), r.get("id")) for r in records if r.get("ph") == "e"
              and type(a := r.get("args")) is dict and type(n := a.get(UNFINISHED_KCH)) is int and n > 0}
    named = {(r.get("pid"), a.get("Op"), a["SeqNum"]) for r in records if r.get("ph") == "i"
             and r.get("cat") == FAILURE_CAT and type(a := r.get("args")) is dict and "SeqNum" in a}
    for pid, w in windows(records).items():
        for u in w.get("Unfinished") if type(w.get("Unfinished")) is list else ():
            if type(u) is dict and type(u.get("Op")) is str:        # a file's JSON: only what the plugin writes
                seq, peer = u.get("SeqNum"), u.get("ToPeer")
                if type(seq) is int or ("SeqNum" not in u and type(peer) is int):
                    named.add((pid, u["Op"], seq if type(seq) is int else ("peer", peer)))
    out = set()
    for (pid, cat, eid), (b, _) in pairs.items():
        if cat != "COLL" and cat != "P2P":
            continue
        a = b.get("args") or {}
        if (pid, cat, eid) in marked or (pid, b.get("name"), a.get("SeqNum") if cat == "COLL"
                                         else ("peer", a.get("Peer"))) in named:
            out.add((pid, eid))
    return out


_OPS_MASK = 0x2 | 0x4           # EventType.COLL | P2P (analyze does not import the runtime's events.abi)


def _without_ops(records: list[dict], by_rank: dict) -> set:
    """The pids whose KernelSteps may lie in no recorded op: recorded with a mask without Coll or P2p (the
    slicetrace_comm record's EventMask), or, where the trace does not say, with no op recorded at all."""
    masks = {r.get("pid"): r["args"]["EventMask"] for r in records if r.get("name") == "slicetrace_comm"
             and type(r.get("args")) is dict and type(r["args"].get("EventMask")) is int}
    pids = {r.get("pid") for r in records if r.get("name") == "KernelStep" and type(r.get("pid")) is int}
    return {p for p in pids if (masks[p] & _OPS_MASK != _OPS_MASK if p in masks else p not in by_rank)}


def kernel_steps(records: list[dict]) -> np.ndarray:
    """KernelStep records -> KERNEL_STEP_TABLE rows (host-timeline ns; ready derived from the clock deltas). Records
    from load_run / load_trace are checked already; others are checked only where they do not fit the table."""
    rows = []
    for i, r in enumerate(records):
        if r.get("name") != "KernelStep" or r.get("ph") != "X":
            continue
        try:
            a = r["args"]
            wait_ns = round(r["ts"] * 1000)
            done_ns = wait_ns + round(r.get("dur", 0) * 1000)
            ready_ns = wait_ns + a["StartGpuClk"] - a["WaitGpuClk"]
            parent = a.get("ParentId")
            rows.append((r.get("pid", 0), a["Channel"], a["IsSend"], a["Peer"], a["Step"], a["Size"], wait_ns,
                         ready_ns, done_ns, a.get("SeqNum", -1), -1 if parent is None else parent))
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as e:   # records not from load_trace
            raise TraceFormatError(f"record {i} (KernelStep): {record_problem(r) or e}") from e
    try:
        return _table(rows, KERNEL_STEP_TABLE, "KernelStep")
    except TraceFormatError:                # name the record, as the loaders do
        for i, r in enumerate(records):
            problem = r.get("name") == "KernelStep" and r.get("ph") == "X" and record_problem(r)
            if problem:
                raise TraceFormatError(f"record {i} (KernelStep): {problem}") from None
        raise


def op_starts(records: list[dict]) -> dict[tuple[int, int], int]:
    """(pid, id) -> begin ns of every Coll and P2p event: a p2p group's parts share theirs."""
    return {(r.get("pid"), r.get("id")): round(float(r["ts"]) * 1000) for r in records
            if r.get("ph") == "b" and r.get("cat") in ("COLL", "P2P") and isinstance(r.get("ts"), (int, float))}


def is_symmetric(args: dict) -> bool:
    """A Coll record of a symmetric kernel (NCCL's rule: no protocol, the kernel's name as the algorithm): its
    KernelSteps are loads from and stores into the peers' windows, no FIFO steps a send and a receive share."""
    return args.get("Protocol") == "" and bool(args.get("Algorithm"))


def symmetric_ops(records: list[dict]) -> set[tuple[int, int]]:
    """(pid, id) of every symmetric kernel's Coll event (is_symmetric): KernelStep `op` values to keep out of
    send -> receive matching."""
    return {(r.get("pid"), r.get("id")) for r in records
            if r.get("ph") == "b" and r.get("cat") == "COLL" and is_symmetric(r.get("args") or {})}


def op_names(records: list[dict]) -> dict[tuple[int, int], str]:
    """(pid, id) -> function name (AllReduce, Send, ...) of every Coll and P2p event: what a KernelStep's ParentId
    (its `op`) names."""
    return {(r.get("pid"), r.get("id")): str(r.get("name", "")) for r in records
            if r.get("ph") == "b" and r.get("cat") in ("COLL", "P2P")}


def coll_spans(records: list[dict]) -> list[tuple[int, str, int, int, int, str | None]]:
    """(rank, function, SeqNum, begin ns, end ns or -1 when it never ended, CommHash) of every Coll event that moves
    data (a Count of 0 runs no channel program)."""
    comm = pid_comms(records)
    ends = {(r.get("pid"), r.get("id")): round(float(r["ts"]) * 1000) for r in records
            if r.get("ph") == "e" and r.get("cat") == "COLL" and isinstance(r.get("ts"), (int, float))}
    return [(int(r.get("pid") or 0), str(r.get("name", "")), int((r.get("args") or {}).get("SeqNum", -1)),
             round(float(r["ts"]) * 1000), ends.get((r.get("pid"), r.get("id")), -1), comm.get(r.get("pid")))
            for r in records
            if r.get("ph") == "b" and r.get("cat") == "COLL" and isinstance(r.get("ts"), (int, float))
            and (r.get("args") or {}).get("Count") != 0]


def _table(rows: list[tuple], dtype: np.dtype, what: str) -> np.ndarray:
    try:
        return np.array(rows, dtype)
    except (OverflowError, TypeError, ValueError) as e:        # e.g. a Channel past int32
        raise TraceFormatError(f"{what} values do not fit the table's columns "
                               f"{[(n, str(dtype[n])) for n in dtype.names]}: {e}") from e


def kernel_chs(records: list[dict]) -> np.ndarray:
    """KernelCh events of collectives -> KERNEL_CH_TABLE rows: the channel program's start and stop on the host
    timeline, with its Coll's function and SeqNum (which match across ranks). KernelCh of p2p ops are left out."""
    problems: list[str] = []
    pairs = _pairs(records, problems)
    colls = {(pid, eid): (b.get("name", ""), (b.get("args") or {}).get("SeqNum", -1))
             for (pid, cat, eid), (b, _) in pairs.items() if cat == "COLL"}
    rows = []
    for (pid, cat, _), (b, e_ts) in pairs.items():
        if cat != "GPU" or b.get("name") != "KernelCh":
            continue
        a = b.get("args") or {}
        parent = colls.get((pid, a.get("ParentId")))
        if parent is None or parent[1] < 0:
            continue
        rows.append((pid or 0, a.get("Channel", 0), parent[1], parent[0], round(float(b["ts"]) * 1000),
                     round(e_ts * 1000)))
    return _table(rows, KERNEL_CH_TABLE, "KernelCh")
