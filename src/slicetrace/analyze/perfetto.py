"""Trace files -> one Perfetto protobuf trace (`slicetrace convert`), with an arrow from each send to its receive.

Perfetto reads Chrome JSON only "on a best-effort basis": overlapping slices of one thread go to an overflow
track and large files are slow. Its own format (TrackEvent packets) keeps nanoseconds and names every track:
per rank (and communicator) a process, in it one track per channel, direction and peer for the KernelSteps,
one per channel for KernelCh and one for the operations; slices that would overlap on a track get a lane of their
own; processes come by communicator (in the order of its first op) and rank, a rank's tracks in channel order
(analyze/perfetto_tracks.py). Each KernelStep send gets a flow to the receive that took its data on the peer (same
communicator, channel and FIFO step: analyze/perfetto_flows.py), so Perfetto draws who waited on whom: from an
instant "send done" inside the send's slice at its end to an instant "recv ready" inside the receive's slice when
its data was there. Not from slice to slice: Perfetto (since PR #2777) points a flow away from whichever of its
slices began first, and a receive often begins (waits) before its send.
The protobuf is written by hand (a few field types: analyze/protobuf.py). An op's failure (the example plugin's
"ERROR" instant) is an instant on its rank's process track, with the same name and args, and the process is named
"rank N (comm H) failed: <error class>", as in the Chrome trace.

Memory and time: files are read one at a time (runfiles.load_runs), each slice kept as a few numbers; the
annotations of records of one shape (the KernelSteps) as an int64 matrix, encoded in numpy a chunk at a time as
they are written. Packets are made in time order (one lexsort of every event) and written a chunk at a time.
"""
from __future__ import annotations

import logging
import os
import struct
from itertools import chain
from typing import Any, Iterable

import numpy as np

from ..errors import TraceFormatError
from ..events.abi import lost_counters
from .atomic import atomic_open
from .perfetto_flows import KINDS, mark_kind, mark_ns, pair_flows
from .perfetto_tracks import INSTANT, layout, pids, places, process_uuid, root_descriptor
from .protobuf import (P_SEQ_ID, P_TIMESTAMP, P_TRACK_EVENT, TE_CATEGORIES, TE_FLOW, TE_FLOW_END, TE_NAME, TE_TRACK,
                       TE_TYPE, TRACE_PACKET, annotation, annotation_rows, fits_rows, packet_heads, pb_bytes, pb_int,
                       pb_str, tag, wire_fields)
from .records import FAILURE_CAT
from .comms import comm_of
from .runfiles import load_runs
from .runranks import every_rank
from .trace import counters, failures, is_symmetric

__all__ = ["convert", "wire_fields"]
log = logging.getLogger("slicetrace")

SLICE_BEGIN, SLICE_END = 1, 2
_SEQ = 1                        # one writer sequence: every packet carries it
_FLOW, _FLOW_END = tag(TE_FLOW, 1), tag(TE_FLOW_END, 1)
_CHUNK = 8192                   # events encoded per numpy call
_INT = {int}
_I64 = (1 << 63) - 1            # Perfetto's timestamps are int64 ns


class _File:
    """One rank's trace, as columns: per slice its track, name and category (indices into strs), begin and end ns,
    and its annotations (a row of `vals` when its args have the shape `main` and int values, else encoded bytes in
    `other`); `keys` holds a (slice, parent kind, is send, src, dst, channel, step, ready - wait ns) row per
    KernelStep."""

    def __init__(self, path: str, recs: list[dict]):
        self.path, self.records = path, len(recs)
        self.comm = comm_of(path, recs)
        self.rank = rank = next((int(r["pid"]) for r in recs if "pid" in r), 0)
        self.others = sorted({r["pid"] for r in recs if "pid" in r} - {rank})     # refused once the run is read
        last = next(reversed(counters(recs).values()), {})          # the file's one rank's (others are refused)
        self.lost = lost_counters(last)         # shown in the process name (Perfetto shows no other place)
        self.failures = failures(recs)          # instants on the process track; the first's error in its name
        self.failed = self.failures[0]["error"] if self.failures else None
        names = {r.get("tid"): (r.get("args") or {}).get("name", "") for r in recs
                 if r.get("ph") == "M" and r.get("name") == "thread_name"}
        # ring and point-to-point connections count their FIFO steps apart: a flow key needs the parent's kind
        # (symmetric kernels' loads and stores: no FIFO steps, so no flows)
        parent_cat = {r.get("id"): "SYM" if is_symmetric(r.get("args") or {}) and r.get("cat") == "COLL" else
                      r.get("cat") for r in recs if r.get("ph") == "b" and r.get("cat") in ("COLL", "P2P")}
        places: dict[tuple, int] = {}       # (track, name, cat) -> its index in self.place
        place, t0, t1, row, keys, flat = [], [], [], [], [], []
        self.other: dict[int, bytes] = {}
        main: tuple | None = None

        def args(a: dict) -> None:          # a slice's annotations, apart from the common shape
            nonlocal main
            shape = tuple(a)
            if main is None and fits_rows(shape) and set(map(type, a.values())) == _INT:
                main = shape
                row.append(len(flat) // len(shape))
                flat.extend(a.values())
                return
            row.append(-1)
            self.other[len(t0) - 1] = b"".join(annotation(k, v) for k, v in a.items())
        opened: dict[tuple, dict] = {}
        x_place: dict[tuple, int] = {}      # (tid, name, cat) of an X record -> its place
        for r in recs:
            ph = r.get("ph")
            if ph == "X":
                nm = r.get("name", "")
                k = (r.get("tid", 0), nm, r.get("cat", ""))
                w = x_place.get(k)
                if w is None:
                    w = x_place[k] = places.setdefault((names.get(k[0]) or f"tid {k[0]}", nm, k[2]), len(places))
                a = r.get("args") or {}
                if nm == "KernelStep" and "Step" in a and "Peer" in a:
                    snd = a.get("IsSend")
                    keys += (len(t0), KINDS.index(_kind(parent_cat, a)), 1 if snd else 0,
                             *((rank, a["Peer"]) if snd else (a["Peer"], rank)), a.get("Channel", 0), a["Step"],
                             a["StartGpuClk"] - a["WaitGpuClk"] if "StartGpuClk" in a and "WaitGpuClk" in a
                             else _I64)         # no clocks: ready when it was done
                b = round(float(r["ts"]) * 1000)
                place.append(w)
                t0.append(b)
                t1.append(b + round(float(r.get("dur", 0)) * 1000))
                if main is not None and tuple(a) == main and set(map(type, a.values())) == _INT:
                    row.append(len(flat) // len(main))
                    flat.extend(a.values())         # not bool, float, str: those encode otherwise
                else:
                    args(a)
            elif ph == "b":
                opened[(r.get("cat"), r.get("id"))] = r
            elif ph == "e":
                bg = opened.pop((r.get("cat"), r.get("id")), None)
                if bg is None:
                    continue                   # check_trace reports these; a viewer just skips them
                a = bg.get("args") or {}
                if r.get("args"):               # an end's own args (an op's UnfinishedKernelCh mark) join the slice's
                    a = {**a, **r["args"]}
                tr = (f"ch {a.get('Channel', 0)} programs" if bg.get("name") == "KernelCh"
                      else "operations" if bg.get("cat") in ("COLL", "P2P") else str(bg.get("cat", "async")))
                place.append(places.setdefault((tr, bg.get("name", ""), bg.get("cat", "")), len(places)))
                t0.append(round(float(bg["ts"]) * 1000))
                t1.append(round(float(r["ts"]) * 1000))
                args(a)
        self.strs = list({s: None for p in places for s in p})
        index = {s: i for i, s in enumerate(self.strs)}
        table = np.array([[index[s] for s in p] for p in places], np.int32).reshape(-1, 3)[np.array(place, np.int64)]
        self.track, self.name, self.cat = table[:, 0], table[:, 1], table[:, 2]
        self.t0, self.t1 = np.array(t0, np.int64), np.array(t1, np.int64)
        self.row, self.main = np.array(row, np.int64), main or ()
        self.keys = np.array(keys, np.int64).reshape(-1, 8)
        try:
            self.vals = np.array(flat, np.int64).reshape(len(flat) // max(len(self.main), 1), len(self.main))
        except OverflowError:               # a value past int64 (a comm hash): those rows as the others
            m = len(self.main)
            for si in np.flatnonzero(self.row >= 0).tolist():
                r0 = self.row[si] * m
                self.other[si] = b"".join(annotation(k, v) for k, v in zip(self.main, flat[r0:r0 + m]))
            self.row[:] = -1
            self.vals = np.zeros((0, m), np.int64)

    def annotations(self, sis: np.ndarray) -> dict[int, bytes]:
        """Slice index -> its annotations' bytes, for the slices `sis`."""
        rows = self.row[sis]
        m = rows >= 0
        out = dict(zip(sis[m].tolist(), annotation_rows(self.main, self.vals[rows[m]]) if m.any() else []))
        for si in sis[~m].tolist():
            out[si] = self.other[si]
        return out


def _kind(parent_cat: dict, a: dict) -> str | None:
    """A KernelStep's parent kind: its Coll/P2p record's, or, when that record is not in the file (cut short: the
    sink writes KernelSteps ahead of their ops), from its SeqNum (a collective's is >= 0); None without a parent."""
    pid = a.get("ParentId")
    kind = parent_cat.get(pid)
    if kind is None and type(pid) is int and pid >= 0 and type(a.get("SeqNum")) is int:
        kind = "COLL" if a["SeqNum"] >= 0 else "P2P"
    return kind


def _events(f: _File, order: np.ndarray, fid: np.ndarray, mark: np.ndarray, at_ns: np.ndarray,
            ) -> tuple[np.ndarray, ...]:
    """The file's begin (slice i: event i), end (n + i) and flow instant events (2n + k, the k-th slice with a mark):
    ns, order at that ns, order among ties, flow (0, 1: _FLOW, 2: _FLOW_END) and flow id. At one instant: the
    instants of sends done there (inside their slice, before its end), ends (a lane's next slice may begin when the
    last one ends), a zero-length send with its instant, receives' instants at their slice's end, those ends,
    begins, the other receives' instants, then ends of zero-length slices (32 ns GPU ticks): every send's instant
    before any receive's (Perfetto drops a terminating flow id met before its start), each instant inside its
    slice. Ties keep `order` (begin, instant, end)."""
    n = len(f.t0)
    zero = f.t1 <= f.t0
    zsend = (mark == 1) & zero
    rend = (mark == 2) & (at_ns == f.t1) & ~zero
    b_at = np.where(zsend, 2, 5)
    e_at = np.where(zsend, 2, np.where(rend, 4, np.where(zero, 7, 1)))
    k = np.flatnonzero(mark)
    i_at = np.where(mark[k] == 1, np.where(zero[k], 2, 0), np.where(rend[k], 3, 6))
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    return (np.r_[f.t0, f.t1, at_ns[k]], np.r_[b_at, e_at, i_at].astype(np.int8),
            np.r_[3 * pos, 3 * pos + 2, 3 * pos[k] + 1], np.r_[np.zeros(2 * n, np.int8), mark[k]],
            np.r_[np.zeros(2 * n, np.uint64), fid[k]])


def _write(out: Any, files: list[_File], evs: list[tuple], heads: list[np.ndarray], pre: list[bytes],
           fails: list[tuple[int, bytes]]) -> None:
    """Every file's events as TrackEvent packets, in (ns, order at that ns, file, order among ties) order, a chunk
    at a time: one sequence in time order (a flow's terminating id must come after its start in the file); the
    failures' packets (ns, bytes; in time order) among them, after the events of their ns."""
    ts, at, seq, flow, fid = (np.concatenate([e[j] for e in evs]) for j in range(5))
    fi = np.concatenate([np.full(len(e[0]), i, np.int32) for i, e in enumerate(evs)])      # small types: memory
    ev = np.concatenate([np.arange(len(e[0]), dtype=np.int32) for e in evs])
    head = np.concatenate(heads)
    del evs
    order = np.lexsort((seq, fi, at, ts))
    del seq
    tags = (b"", _FLOW, _FLOW_END)
    pre_len = np.array([len(p) for p in pre], np.int64)
    f_ts, j = np.array([t for t, _ in fails], np.int64), 0
    for c in range(0, len(order), _CHUNK):
        idx = order[c:c + _CHUNK]
        gf, ge, h, fl = fi[idx], ev[idx], head[idx], flow[idx]
        ann = [b""] * len(idx)
        for k in np.unique(gf).tolist():
            at_k = np.flatnonzero((gf == k) & (ge < len(files[k].t0)))
            got = files[k].annotations(ge[at_k])
            for p, si in zip(at_k.tolist(), ge[at_k].tolist()):
                ann[p] = got[si]
        flows = [b""] * len(idx)
        for p in np.flatnonzero(fl).tolist():
            flows[p] = tags[fl[p]] + struct.pack("<Q", int(fid[idx[p]]))
        size = pre_len[h] + np.fromiter(map(len, ann), np.int64, len(idx)) + np.where(fl > 0, 8 + len(_FLOW), 0)
        parts = zip(packet_heads(ts[idx], size, _SEQ), map(pre.__getitem__, h.tolist()), ann, flows)
        k = len(fails) if c + _CHUNK >= len(order) else int(np.searchsorted(f_ts, ts[idx[-1]], "right"))
        if j == k:                          # the common case: no failure in this chunk's time
            out.write(b"".join(chain.from_iterable(parts)))
            continue
        pkts = list(map(b"".join, parts))
        for at_p, (_, pkt) in reversed(list(zip(np.searchsorted(ts[idx], f_ts[j:k], "right").tolist(), fails[j:k]))):
            pkts.insert(at_p, pkt)
        j = k
        out.write(b"".join(pkts))


def _failure_packets(files: list[_File]) -> list[tuple[int, bytes]]:
    """Each file's failures as (ns, TracePacket bytes), in time order: an instant on its process's track, named and
    annotated as the example plugin's instant is."""
    out = []
    for f in files:
        track = pb_int(TE_TYPE, INSTANT) + pb_int(TE_TRACK, process_uuid(f)) + pb_str(TE_CATEGORIES, FAILURE_CAT)
        for x in f.failures:
            args = {"Error": x["error"], "Message": x["message"], "Op": x["op"], "SeqNum": x["seq"]}
            event = track + pb_str(TE_NAME, str(x["name"])) + b"".join(
                annotation(k, v) for k, v in args.items() if v is not None)
            ts = max(x["ts_ns"], 0)
            out.append((ts, pb_bytes(TRACE_PACKET, pb_int(P_TIMESTAMP, ts) + pb_int(P_SEQ_ID, _SEQ)
                                     + pb_bytes(P_TRACK_EVENT, event))))
    return sorted(out, key=lambda p: p[0])


def _from_zero(files: list[_File]) -> None:
    """A trace that begins before 0 moves later as a whole: Perfetto drops each event before 0 (a slice's end
    then ends nothing), and reads a timestamp as int64 ns."""
    lo = min(int(f.t0.min()) for f in files if len(f.t0))
    if lo >= 0:
        return
    hi = max(int(f.t1.max()) for f in files if len(f.t1))
    if hi - lo > _I64:
        raise TraceFormatError(f"the trace's slices span {lo} .. {hi} ns: a Perfetto trace's timestamps are ns from "
                               f"0 to {_I64} (int64), so it holds a span of at most {_I64} ns")
    for f in files:
        f.t0 -= lo
        f.t1 -= lo
        for x in f.failures:
            x["ts_ns"] -= lo
    log.warning("slicetrace convert: the trace begins at %d ns, before 0, where Perfetto drops events: every "
                "timestamp is written %d ns later (order and durations kept)", lo, -lo)


def convert(paths: Iterable[str], out_path: str, partial: bool = False, all_comms: bool = False) -> dict:
    """Write the Perfetto trace of `paths` (per-rank Chrome traces of one run, read and checked as report reads
    them: trace.load_files, and runranks.every_rank) to out_path; returns what it wrote, and in `left_out` the
    ranks --partial (`partial`: empty files left out too) went on without ('' for none). all_comms (--all-comms):
    the files may be of several communicators of one job (trace.load_comms), each checked as a run of its own, and
    the result's `comms` says what each one wrote (comm, name, files, slices, flows), in their order."""
    paths = [os.fspath(p) for p in paths]
    runs = load_runs(paths, "convert", _File, partial, all_comms) if paths else []
    files = [f for r in runs for f in r.kept]
    if not files:
        raise TraceFormatError("convert: no trace files given")
    where = paths[0] if len(paths) == 1 else f"{len(paths)} trace files"
    notes = []                  # each communicator's ranks --partial went on without
    for r in runs:
        tag = f"commHash {r.facts.comm}" if len(runs) > 1 else ""
        lost = every_rank(f"{where} ({tag})" if tag else where, r.ranks, {f.rank for f in r.kept}, partial)
        if lost:
            notes.append(f"{tag}: {lost}" if tag else lost)
    left_out = "; ".join(notes)
    for f in files:             # a merged file: every rank's slices were drawn as its first record's rank's
        if f.others:
            raise TraceFormatError(f"trace file {f.path!r} holds records of {len(f.others) + 1} ranks (pid {f.rank}, "
                                   f"then {', '.join(map(str, f.others[:5]))}{' ...' if len(f.others) > 5 else ''}): "
                                   f"convert takes one file per rank, as the example plugin writes them; give those")
    if not any(len(f.t0) for f in files):      # a viewer would show nothing: not what the user meant to convert
        names = ", ".join(repr(f.path) for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        raise TraceFormatError(f"{names}: no slices to convert ({sum(f.records for f in files)} records, none a "
                               f"complete 'X' event or 'b'/'e' pair); give per-rank trace files, e.g. those of "
                               f"`slicetrace bench --trace DIR`")
    _from_zero(files)
    at_ns = [mark_ns(f) for f in files]
    fids, nflows, unpaired, back = pair_flows(files, at_ns)
    if unpaired:
        log.warning("slicetrace convert: %d KernelStep send(s) have no send -> receive arrow: their receive is not "
                    "in the files given, or sends and receives of one connection and step do not pair up", unpaired)
    if back:
        log.warning("slicetrace convert: %d send -> receive arrow(s) left out: the receive ended before its send "
                    "was done (the ranks' clocks disagree), and Perfetto does not draw an arrow back in time", back)
    pre: dict[tuple, int] = {}      # the events' heads (track, and name, category or INSTANT): their bytes once
    marks = [mark_kind(f, fid) for f, fid in zip(files, fids)]
    descriptors: list[bytes] = [root_descriptor()]
    place = places(files)
    placed = [layout(f, pid, p, descriptors, pre, m) for f, pid, p, m in zip(files, pids(files, place), place, marks)]
    evs = [_events(f, p[0], fids[fi], marks[fi], at_ns[fi]) for fi, (f, p) in enumerate(zip(files, placed))]
    heads = [np.r_[b, e, i[m != 0]] for (_, b, e, i), m in zip(placed, marks)]
    del placed, marks, at_ns
    pre_bytes = [pb_int(TE_TYPE, SLICE_END) + pb_int(TE_TRACK, h[0]) if len(h) == 1 else
                 pb_int(TE_TYPE, INSTANT) + pb_int(TE_TRACK, h[0]) + pb_str(TE_NAME, h[1]) if h[2] == INSTANT else
                 pb_int(TE_TYPE, SLICE_BEGIN) + pb_int(TE_TRACK, h[0]) + pb_str(TE_NAME, h[1])
                 + (pb_str(TE_CATEGORIES, h[2]) if h[2] else b"") for h in pre]
    with atomic_open(out_path, "wb") as out:        # a failed write leaves no half trace
        for d in descriptors:
            out.write(pb_bytes(TRACE_PACKET, d + pb_int(P_SEQ_ID, _SEQ)))
        _write(out, files, evs, heads, pre_bytes, _failure_packets(files))
    got = {"files": len(files), "slices": sum(len(f.t0) for f in files), "flows": sum(nflows.values()),
           "tracks": len(descriptors) - 1 - 2 * len(files), "unpaired_sends": unpaired, "left_out": left_out,
           "failures": sum(len(f.failures) for f in files)}
    if all_comms:               # without it, the dict callers know
        got["comms"] = [{"comm": r.kept[0].comm, "name": r.facts.name, "files": len(r.kept),
                         "slices": sum(len(f.t0) for f in r.kept), "flows": nflows[r.kept[0].comm]} for r in runs]
    return got
