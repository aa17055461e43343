"""Trace files -> one Perfetto protobuf trace (`slicetrace convert`), with an arrow from each send to its receive.

Perfetto reads Chrome JSON only "on a best-effort basis": overlapping slices of one thread go to an overflow
track and large files are slow. Its own format (TrackEvent packets) keeps nanoseconds and names every track:
per rank (and communicator) a process, in it one track per channel, direction and peer for the KernelSteps,
one per channel for KernelCh and one for the operations; slices that would overlap on a track get a lane of their
own. Each KernelStep send gets a flow to the receive that took its data on the peer (same communicator, channel
and FIFO step), so Perfetto draws who waited on whom. The protobuf is written by hand (a few field types, analyze/protobuf.py).

Memory and time: files are read one at a time (runfiles.load_each), each slice kept as a few numbers; the
annotations of records of one shape (the KernelSteps) as an int64 matrix, encoded in numpy a chunk at a time as
they are written. Each file's packets are generated in time order and merged (heapq) straight into the file.
"""
from __future__ import annotations

import hashlib
import heapq
import logging
import os
import struct
from typing import Any, Iterable, Iterator

import numpy as np

from ..errors import TraceFormatError
from .atomic import atomic_open
from .protobuf import (P_SEQ_ID, P_TIMESTAMP, P_TRACK_DESCRIPTOR, P_TRACK_EVENT, PD_NAME, PD_PID, TD_NAME,
                       TD_PARENT, TD_PROCESS, TD_UUID, TE_CATEGORIES, TE_FLOW, TE_FLOW_END, TE_NAME, TE_TRACK, TE_TYPE,
                       TRACE_PACKET, annotation, annotation_rows, fits_rows, pb_bytes, pb_int, pb_str, tag, varint,
                       varint_rows, wire_fields)
from .runfiles import load_each
from .trace import comm_of

__all__ = ["convert", "wire_fields"]
log = logging.getLogger("slicetrace")

SLICE_BEGIN, SLICE_END = 1, 2
_SEQ = 1                        # one writer sequence: every packet carries it
_KINDS = (None, "COLL", "P2P")  # a KernelStep's parent kind (_kind), as a code
# tag bytes that every packet repeats, computed once
_PKT, _TS, _SEQ_TE = tag(TRACE_PACKET, 2), tag(P_TIMESTAMP, 0), pb_int(P_SEQ_ID, _SEQ) + tag(P_TRACK_EVENT, 2)
_FLOW, _FLOW_END = tag(TE_FLOW, 1), tag(TE_FLOW_END, 1)
_CHUNK = 8192                   # events encoded per numpy call
_INT = {int}


def _uuid(*parts: Any) -> int:
    """A stable 64-bit id for a track or a flow."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") or 1


class _File:
    """One rank's trace, as columns: per slice its track, name and category (indices into strs), begin and end ns,
    and its annotations (a row of `vals` when its args have the shape `main` and int values, else encoded bytes in
    `other`); `keys` holds a (slice, parent kind, is send, src, dst, channel, step) row per KernelStep."""

    def __init__(self, path: str, recs: list[dict]):
        self.path, self.records = path, len(recs)
        self.comm = comm_of(path, recs)
        self.rank = rank = next((int(r["pid"]) for r in recs if "pid" in r), 0)
        names = {r.get("tid"): r.get("args", {}).get("name", "") for r in recs
                 if r.get("ph") == "M" and r.get("name") == "thread_name"}
        # ring and point-to-point connections count their FIFO steps apart: a flow key needs the parent's kind
        parent_cat = {r.get("id"): r.get("cat") for r in recs if r.get("ph") == "b" and r.get("cat") in
                      ("COLL", "P2P")}
        strs: dict[str, int] = {}
        track, name, cat, t0, t1, row, keys, rows = [], [], [], [], [], [], [], []
        self.other: dict[int, bytes] = {}
        main: tuple | None = None

        def add(tr: str, nm: str, ct: str, b: int, e: int, a: dict) -> None:
            nonlocal main
            track.append(strs.setdefault(tr, len(strs)))
            name.append(strs.setdefault(nm, len(strs)))
            cat.append(strs.setdefault(ct, len(strs)))
            t0.append(b)
            t1.append(e)
            shape = tuple(a)
            if shape == main or main is None and fits_rows(shape):
                vs = tuple(a.values())
                if set(map(type, vs)) == _INT:         # not bool, float, str: those encode otherwise
                    main = shape
                    row.append(len(rows))
                    rows.append(vs)
                    return
            row.append(-1)
            self.other[len(t0) - 1] = b"".join(annotation(k, v) for k, v in a.items())
        opened: dict[tuple, dict] = {}
        tracks: dict[Any, str] = {}
        for r in recs:
            ph = r.get("ph")
            if ph == "X":
                b = round(float(r["ts"]) * 1000)
                tid = r.get("tid", 0)
                a = r.get("args") or {}
                if r.get("name") == "KernelStep" and "Step" in a and "Peer" in a:
                    snd = a.get("IsSend")
                    keys.append((len(t0), _KINDS.index(_kind(parent_cat, a)), 1 if snd else 0,
                                 *((rank, a["Peer"]) if snd else (a["Peer"], rank)), a.get("Channel", 0), a["Step"]))
                tr = tracks.get(tid)
                if tr is None:
                    tr = tracks[tid] = names.get(tid) or f"tid {tid}"
                add(tr, r.get("name", ""), r.get("cat", ""), b, b + round(float(r.get("dur", 0)) * 1000), a)
            elif ph == "b":
                opened[(r.get("cat"), r.get("id"))] = r
            elif ph == "e":
                bg = opened.pop((r.get("cat"), r.get("id")), None)
                if bg is None:
                    continue                   # check_trace reports these; a viewer just skips them
                args = bg.get("args") or {}
                tr = (f"ch {args.get('Channel', 0)} programs" if bg.get("name") == "KernelCh"
                      else "operations" if bg.get("cat") in ("COLL", "P2P") else str(bg.get("cat", "async")))
                add(tr, bg.get("name", ""), bg.get("cat", ""), round(float(bg["ts"]) * 1000),
                    round(float(r["ts"]) * 1000), args)
        self.strs = list(strs)
        self.track, self.name, self.cat = (np.array(x, np.int32) for x in (track, name, cat))
        self.t0, self.t1 = np.array(t0, np.int64), np.array(t1, np.int64)
        self.row, self.main = np.array(row, np.int64), main or ()
        self.keys = np.array(keys, np.int64).reshape(-1, 7)
        try:
            self.vals = np.array(rows, np.int64).reshape(len(rows), len(self.main))
        except OverflowError:               # a value past int64 (a comm hash): those rows as the others
            for si in np.flatnonzero(self.row >= 0).tolist():
                self.other[si] = b"".join(annotation(k, v) for k, v in zip(self.main, rows[self.row[si]]))
            self.row[:] = -1
            self.vals = np.zeros((0, len(self.main)), np.int64)

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


def _flows(files: list[_File]) -> tuple[list[np.ndarray], int, int, int]:
    """Per file the flow id of each slice (0: none) for both ends of each send whose receive is in the files, how
    many flows, how many sends got none, and how many receives end before their send. What a send and its receive share (the key):
    the communicator, the connection (ring and point-to-point ones count their steps apart, hence the parent kind;
    a connection sits on one channel at both ends, plan.schedule.p2p_channel) and the FIFO step. A key seen n times
    on both sides (connections told apart by no parent, or a connection's step counter reused) pairs its i-th send
    with its i-th receive by time: one communicator's ops run one after the other on each rank. A key with more
    sends than receives (or fewer) pairs nothing: which is which is not known."""
    comms = sorted({f.comm for f in files})
    cols = np.concatenate([np.column_stack([np.full(len(f.keys), comms.index(f.comm)), f.keys[:, 1:],
                                            f.t0[f.keys[:, 0]], np.full(len(f.keys), fi), f.keys[:, 0],
                                            f.t1[f.keys[:, 0]]]) for fi, f in enumerate(files)])
    # columns: comm, kind, snd, src, dst, ch, step, t0, file, slice, t1
    fids = [np.zeros(len(f.t0), np.uint64) for f in files]
    if not len(cols):
        return fids, 0, 0, 0
    # by key, receives before sends, each by (begin, file, slice): a group's i-th receive pairs its i-th send
    order = np.lexsort((cols[:, 9], cols[:, 8], cols[:, 7], cols[:, 2], cols[:, 6], cols[:, 5], cols[:, 4],
                        cols[:, 3], cols[:, 1], cols[:, 0]))
    c = cols[order]
    key = c[:, [0, 1, 3, 4, 5, 6]]
    start = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]).any(1)])
    size = np.diff(np.r_[start, len(c)])
    sends = np.add.reduceat(c[:, 2], start)
    ok = sends * 2 == size
    unpaired = int(sends[~ok].sum())
    n = sends[ok]
    nth = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)           # a pair's index in its group
    rcv, snd = c[np.repeat(start[ok], n) + nth], c[np.repeat(start[ok] + n, n) + nth]
    ids = np.array([_uuid("flow", comms[s[0]], _KINDS[s[1]], *s[3:7], i)
                    for s, i in zip(snd[:, :7].tolist(), nth.tolist())], np.uint64)
    for end in (snd, rcv):
        for fi in range(len(files)):
            at = end[:, 8] == fi
            fids[fi][end[at, 9]] = ids[at]
    return fids, len(ids), unpaired, int((rcv[:, 10] < snd[:, 10]).sum())


def _lanes(f: _File, descriptors: list[bytes]) -> tuple[list[int], np.ndarray]:
    """Each slice's track uuid (slices that would overlap on a track get a lane of their own, lanes first fit in
    begin order) and that order; appends the process's and each new lane's descriptor."""
    proc = _uuid("proc", f.comm, f.rank)
    descriptors.append(pb_bytes(P_TRACK_DESCRIPTOR, pb_int(TD_UUID, proc) + pb_bytes(    # pid 0: Perfetto's idle
        TD_PROCESS, pb_int(PD_PID, f.rank + 1) + pb_str(PD_NAME, f"rank {f.rank} (comm {f.comm})"))))
    lanes: dict[int, list[int]] = {}        # track -> end of the last slice of each lane
    flat: dict[int, list[int]] = {}         # ... the instant of its last slice if that one had no length, else -1
    uid_of: dict[tuple[int, int], int] = {}
    order = np.lexsort((-f.t1, f.t0))       # by begin, longest first; stable
    t0s, t1s, trs = f.t0.tolist(), f.t1.tolist(), f.track.tolist()
    uids = [0] * len(t0s)
    for si in order.tolist():
        t0, t1, tr = t0s[si], t1s[si], trs[si]
        ends = lanes.get(tr)
        if ends is None:
            ends, zs = lanes[tr], flat[tr] = [], []
        else:
            zs = flat[tr]
        # two zero-length slices at one instant on one lane would come out begin, begin, end, end: nested
        lane = next((i for i, e in enumerate(ends) if e <= t0 and not (t1 <= t0 and zs[i] == t0)), len(ends))
        if lane == len(ends):
            name = f.strs[tr]
            uid = uid_of[(tr, lane)] = _uuid("track", f.comm, f.rank, name, lane)
            ends.append(t1)
            zs.append(-1)
            descriptors.append(pb_bytes(P_TRACK_DESCRIPTOR, pb_int(TD_UUID, uid) + pb_int(TD_PARENT, proc)
                                        + pb_str(TD_NAME, name if lane == 0 else f"{name} #{lane}")))
        ends[lane], zs[lane] = t1, (t0 if t1 <= t0 else -1)
        uids[si] = uid_of[(tr, lane)]
    return uids, order


def _packets(fi: int, f: _File, uids: list[int], order: np.ndarray, fid: np.ndarray) -> Iterator[tuple]:
    """The file's TrackEvent packets in write order, as (ns, order at that ns, file, index, packet). At one instant:
    ends (a lane's next slice may begin when the last one ends), the begin of a zero-length send with its flow, ends
    of receives with theirs (after their send: Perfetto drops a terminating flow id met before its start), begins,
    then ends of zero-length slices (32 ns GPU ticks), a zero-length receive's with its flow last. Ties keep the
    order of files, then of `order` (begin before end)."""
    n = len(f.t0)
    zero, has = f.t1 <= f.t0, fid != 0
    snd = np.zeros(n, bool)
    snd[f.keys[:, 0]] = f.keys[:, 2] == 1
    b_at = np.where(has & snd & zero, 1, 3)            # its begin is its end, and goes before the receives' ends
    e_at = np.where(has & ~(snd & zero), np.where(snd, 0, np.where(zero, 5, 2)), np.where(zero, 4, 0))
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    ts, at, seq = np.r_[f.t0, f.t1], np.r_[b_at, e_at], np.r_[2 * pos, 2 * pos + 1]
    events = np.lexsort((seq, at, ts))
    names, cats, fids, snds, b_ats = f.name.tolist(), f.cat.tolist(), fid.tolist(), snd.tolist(), b_at.tolist()
    begin: dict[tuple, bytes] = {}
    end: dict[int, bytes] = {}
    for c in range(0, 2 * n, _CHUNK):
        idx = events[c:c + _CHUNK]
        ann = f.annotations(idx[idx < n])
        for e, t, tb, a, s in zip(idx.tolist(), ts[idx].tolist(), varint_rows(ts[idx]), at[idx].tolist(),
                                  seq[idx].tolist()):
            if e < n:
                k = (uids[e], names[e], cats[e])
                ev = begin.get(k)
                if ev is None:
                    ev = begin[k] = (pb_int(TE_TYPE, SLICE_BEGIN) + pb_int(TE_TRACK, k[0]) + pb_str(TE_NAME, f.strs[k[1]])
                                     + (pb_str(TE_CATEGORIES, f.strs[k[2]]) if f.strs[k[2]] else b""))
                ev += ann[e]
                if a == 1:
                    ev += _FLOW + struct.pack("<Q", fids[e])
            else:
                e -= n
                ev = end.get(uids[e])
                if ev is None:
                    ev = end[uids[e]] = pb_int(TE_TYPE, SLICE_END) + pb_int(TE_TRACK, uids[e])
                if fids[e] and b_ats[e] != 1:
                    ev += (_FLOW if snds[e] else _FLOW_END) + struct.pack("<Q", fids[e])
            inner = _TS + tb + _SEQ_TE + varint(len(ev)) + ev
            yield t, a, fi, s, _PKT + varint(len(inner)) + inner


def convert(paths: Iterable[str], out_path: str) -> dict[str, int]:
    """Write the Perfetto trace of `paths` (per-rank Chrome traces of one run, read and checked as report reads
    them: trace.load_files) to out_path; returns what it wrote."""
    paths = [os.fspath(p) for p in paths]
    files = load_each(paths, "convert", _File) if paths else []
    if not files:
        raise TraceFormatError("convert: no trace files given")
    if not any(len(f.t0) for f in files):      # a viewer would show nothing: not what the user meant to convert
        names = ", ".join(repr(f.path) for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        raise TraceFormatError(f"{names}: no slices to convert ({sum(f.records for f in files)} records, none a "
                               f"complete 'X' event or 'b'/'e' pair); give per-rank trace files, e.g. those of "
                               f"`slicetrace bench --trace DIR`")
    fids, nflows, unpaired, back = _flows(files)
    if unpaired:
        log.warning("slicetrace convert: %d KernelStep send(s) have no send -> receive arrow: their receive is not "
                    "in the files given, or sends and receives of one connection and step do not pair up", unpaired)
    if back:
        log.warning("slicetrace convert: %d send -> receive arrow(s) whose receive ends before its send (the ranks' "
                    "clocks disagree by more than the slice): Perfetto does not draw those", back)
    descriptors: list[bytes] = []
    streams = [_packets(fi, f, *_lanes(f, descriptors), fids[fi]) for fi, f in enumerate(files)]
    # one sequence, written in time order: a flow's terminating id must come after its start in the file
    with atomic_open(out_path, "wb") as out:        # a failed write leaves no half trace
        for d in descriptors:
            out.write(pb_bytes(TRACE_PACKET, d + pb_int(P_SEQ_ID, _SEQ)))
        for *_, p in heapq.merge(*streams):
            out.write(p)
    return {"files": len(files), "slices": sum(len(f.t0) for f in files), "flows": nflows,
            "tracks": len(descriptors) - len(files), "unpaired_sends": unpaired}
