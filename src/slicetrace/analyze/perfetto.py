"""Trace files -> one Perfetto protobuf trace (`slicetrace convert`), with an arrow from each send to its receive.

Perfetto reads Chrome JSON only "on a best-effort basis": overlapping slices of one thread go to an overflow
track and large files are slow. Its own format (TrackEvent packets) keeps nanoseconds and names every track:
per rank (and communicator) a process, in it one track per channel, direction and peer for the KernelSteps,
one per channel for KernelCh and one for the operations; slices that would overlap on a track get a lane of their
own. Each KernelStep send gets a flow to the receive that took its data on the peer (same communicator, channel
and FIFO step), so Perfetto draws who waited on whom. The protobuf is written by hand (a few field types).
"""
from __future__ import annotations

import hashlib
import logging
import os
import struct
from typing import Any, Iterable

from ..errors import TraceFormatError
from .atomic import atomic_open
from .trace import comm_of, load_files

log = logging.getLogger("slicetrace")

# field numbers of perfetto/trace/*.proto
_TRACE_PACKET = 1
_P_TIMESTAMP, _P_SEQ_ID, _P_TRACK_EVENT, _P_TRACK_DESCRIPTOR = 8, 10, 11, 60
_TD_UUID, _TD_NAME, _TD_PROCESS, _TD_PARENT = 1, 2, 3, 5
_PD_PID, _PD_NAME = 1, 6
_TE_ANNOTATIONS, _TE_TYPE, _TE_TRACK, _TE_CATEGORIES, _TE_NAME, _TE_FLOW, _TE_FLOW_END = 4, 9, 11, 22, 23, 47, 48
_DA_BOOL, _DA_UINT, _DA_INT, _DA_DOUBLE, _DA_STRING, _DA_NAME = 2, 3, 4, 5, 6, 10
SLICE_BEGIN, SLICE_END = 1, 2
_SEQ = 1                        # one writer sequence: every packet carries it


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1          # negative int64s as two's complement, as protobuf does
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _int(field: int, v: int) -> bytes:
    return _varint(field << 3) + _varint(v)


def _bytes(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _str(field: int, text: str) -> bytes:
    return _bytes(field, text.encode())


def _fixed64(field: int, v: int) -> bytes:
    return _varint(field << 3 | 1) + struct.pack("<Q", v & ((1 << 64) - 1))


def _annotation(name: str, v: Any) -> bytes:
    if isinstance(v, bool):
        val = _int(_DA_BOOL, int(v))
    elif isinstance(v, int):
        val = _int(_DA_UINT if v >= 1 << 63 else _DA_INT, v)       # e.g. a comm hash past int64
    elif isinstance(v, float):
        val = _varint(_DA_DOUBLE << 3 | 1) + struct.pack("<d", v)
    else:
        val = _str(_DA_STRING, str(v))
    return _bytes(_TE_ANNOTATIONS, _str(_DA_NAME, name) + val)


def _uuid(*parts: Any) -> int:
    """A stable 64-bit id for a track or a flow."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") or 1


class _File:
    """One rank's trace: its slices, grouped by the track they go on."""

    def __init__(self, path: str, recs: list[dict]):
        self.path, self.records = path, len(recs)
        self.comm = comm_of(path, recs)
        self.rank = next((int(r["pid"]) for r in recs if "pid" in r), 0)
        names = {r.get("tid"): r.get("args", {}).get("name", "") for r in recs
                 if r.get("ph") == "M" and r.get("name") == "thread_name"}
        # (track name, name, cat, start_ns, end_ns, args, flow key: a KernelStep's, else None)
        self.slices: list[tuple] = []
        # ring and point-to-point connections count their FIFO steps apart: a flow key needs the parent's kind
        parent_cat = {r.get("id"): r.get("cat") for r in recs if r.get("ph") == "b" and r.get("cat") in
                      ("COLL", "P2P")}
        opened: dict[tuple, dict] = {}
        for r in recs:
            ph = r.get("ph")
            if ph == "X":
                t0 = round(float(r["ts"]) * 1000)
                tid = r.get("tid", 0)
                a = r.get("args", {})
                key = (_flow_key(self.comm, self.rank, _kind(parent_cat, a), a)
                       if r.get("name") == "KernelStep" and "Step" in a and "Peer" in a else None)
                self.slices.append((names.get(tid) or f"tid {tid}", r.get("name", ""), r.get("cat", ""), t0,
                                    t0 + round(float(r.get("dur", 0)) * 1000), a, key))
            elif ph == "b":
                opened[(r.get("cat"), r.get("id"))] = r
            elif ph == "e":
                b = opened.pop((r.get("cat"), r.get("id")), None)
                if b is None:
                    continue                   # check_trace reports these; a viewer just skips them
                args = b.get("args", {})
                track = (f"ch {args.get('Channel', 0)} programs" if b.get("name") == "KernelCh"
                         else "operations" if b.get("cat") in ("COLL", "P2P") else str(b.get("cat", "async")))
                self.slices.append((track, b.get("name", ""), b.get("cat", ""), round(float(b["ts"]) * 1000),
                                    round(float(r["ts"]) * 1000), args, None))


def _kind(parent_cat: dict, a: dict) -> str | None:
    """A KernelStep's parent kind: its Coll/P2p record's, or, when that record is not in the file (cut short: the
    sink writes KernelSteps ahead of their ops), from its SeqNum (a collective's is >= 0); None without a parent."""
    pid = a.get("ParentId")
    kind = parent_cat.get(pid)
    if kind is None and type(pid) is int and pid >= 0 and type(a.get("SeqNum")) is int:
        kind = "COLL" if a["SeqNum"] >= 0 else "P2P"
    return kind


def _flow_key(comm: str, rank: int, kind: str | None, a: dict) -> tuple:
    """What a send and its receive share: the connection (ring and point-to-point ones count their steps apart; a
    connection sits on one channel at both ends, plan.schedule.p2p_channel) and the FIFO step. Without parents
    (kind None) a ring's and a p2p connection's step k share a key: _flows pairs those in time order."""
    src, dst = (rank, a["Peer"]) if a.get("IsSend") else (a["Peer"], rank)
    return comm, kind, src, dst, a.get("Channel", 0), a["Step"]


def _flows(files: list[_File]) -> tuple[dict[tuple[int, int], int], int]:
    """((file index, slice index) -> flow id) for both ends of each send whose receive is in the files, and how
    many sends got none. A key seen n times on both sides (connections told apart by no parent, or a connection's
    step counter reused) pairs its i-th send with its i-th receive by time: one communicator's ops run one after
    the other on each rank. A key with more sends than receives (or fewer) pairs nothing: which is which is not
    known."""
    sides: tuple[dict[tuple, list], dict[tuple, list]] = ({}, {})
    for fi, f in enumerate(files):
        for si, s in enumerate(f.slices):
            if s[6] is not None:
                sides[0 if s[5].get("IsSend") else 1].setdefault(s[6], []).append((s[3], fi, si))
    sends, recvs = sides
    out: dict[tuple[int, int], int] = {}
    unpaired = 0
    for key, ss in sends.items():
        rs = recvs.get(key, [])
        if len(rs) != len(ss):
            unpaired += len(ss)
            continue
        for i, (s, r) in enumerate(zip(sorted(ss), sorted(rs))):
            out[s[1:]] = out[r[1:]] = _uuid("flow", *key, i)
    return out, unpaired


def convert(paths: Iterable[str], out_path: str) -> dict[str, int]:
    """Write the Perfetto trace of `paths` (per-rank Chrome traces of one run, read and checked as report reads
    them: trace.load_files) to out_path; returns what it wrote."""
    paths = [os.fspath(p) for p in paths]
    files = [_File(f, recs) for f, recs in load_files(paths, "convert")] if paths else []
    if not files:
        raise TraceFormatError("convert: no trace files given")
    if not any(f.slices for f in files):        # a viewer would show nothing: not what the user meant to convert
        names = ", ".join(repr(f.path) for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        raise TraceFormatError(f"{names}: no slices to convert ({sum(f.records for f in files)} records, none a "
                               f"complete 'X' event or 'b'/'e' pair); give per-rank trace files, e.g. those of "
                               f"`slicetrace bench --trace DIR`")
    flows, unpaired = _flows(files)
    if unpaired:
        log.warning("slicetrace convert: %d KernelStep send(s) have no send -> receive arrow: their receive is not "
                    "in the files given, or sends and receives of one connection and step do not pair up", unpaired)
    # (ns, order, packet), sorted later. At one instant: ends (a lane's next slice may begin when the last one ends),
    # the begin of a zero-length send with its flow, ends of receives with theirs (after their send: Perfetto drops
    # a terminating flow id met before its start), begins, then ends of zero-length slices (32 ns GPU ticks), a
    # zero-length receive's with its flow last
    packets: list[tuple[int, int, bytes]] = []
    flow_at: dict[int, list[int]] = {}          # flow id -> [its start ns, its end ns]
    descriptors: list[bytes] = []
    nslices = nflows = 0
    for fi, f in enumerate(files):
        proc = _uuid("proc", f.comm, f.rank)
        descriptors.append(_bytes(_P_TRACK_DESCRIPTOR, _int(_TD_UUID, proc) + _bytes(    # pid 0: Perfetto's idle
            _TD_PROCESS, _int(_PD_PID, f.rank + 1) + _str(_PD_NAME, f"rank {f.rank} (comm {f.comm})"))))
        lanes: dict[str, list[int]] = {}       # track name -> end of the last slice of each lane
        flat: dict[str, list[int]] = {}        # ... the instant of its last slice if that one had no length, else -1
        order = sorted(range(len(f.slices)), key=lambda i: (f.slices[i][3], -f.slices[i][4]))
        for si in order:
            track, name, cat, t0, t1, args, key = f.slices[si]
            ends, zs = lanes.setdefault(track, []), flat.setdefault(track, [])
            # two zero-length slices at one instant on one lane would come out begin, begin, end, end: nested
            lane = next((i for i, e in enumerate(ends) if e <= t0 and not (t1 <= t0 and zs[i] == t0)), len(ends))
            uid = _uuid("track", f.comm, f.rank, track, lane)
            if lane == len(ends):
                ends.append(t1)
                zs.append(-1)
                descriptors.append(_bytes(_P_TRACK_DESCRIPTOR, _int(_TD_UUID, uid) + _int(_TD_PARENT, proc)
                                          + _str(_TD_NAME, track if lane == 0 else f"{track} #{lane}")))
            ends[lane], zs[lane] = t1, (t0 if t1 <= t0 else -1)
            ev = _int(_TE_TYPE, SLICE_BEGIN) + _int(_TE_TRACK, uid) + _str(_TE_NAME, name)
            if cat:
                ev += _str(_TE_CATEGORIES, cat)
            ev += b"".join(_annotation(k, v) for k, v in args.items())
            end = _int(_TE_TYPE, SLICE_END) + _int(_TE_TRACK, uid)
            fid = None if key is None else flows.get((fi, si))
            zero, snd, b_at, e_at = t1 <= t0, bool(args.get("IsSend")), 3, (4 if t1 <= t0 else 0)
            if fid is not None:         # on the ends: a receive may begin waiting before its send begins, but it
                flow_at.setdefault(fid, [0, 0])[not snd] = t1       # ends after the send ends
                nflows += snd
                if snd and zero:        # its begin is its end, and goes before the receives' ends
                    ev, b_at = ev + _fixed64(_TE_FLOW, fid), 1
                else:
                    end += _fixed64(_TE_FLOW if snd else _TE_FLOW_END, fid)
                    e_at = 0 if snd else (5 if zero else 2)
            packets.append((t0, b_at, _packet(t0, ev)))
            packets.append((t1, e_at, _packet(t1, end)))
            nslices += 1
    back = sum(1 for a, b in flow_at.values() if b < a)
    if back:
        log.warning("slicetrace convert: %d send -> receive arrow(s) whose receive ends before its send (the ranks' "
                    "clocks disagree by more than the slice): Perfetto does not draw those", back)
    packets.sort(key=lambda p: (p[0], p[1]))
    with atomic_open(out_path, "wb") as out:        # a failed write leaves no half trace
        for d in descriptors:
            out.write(_bytes(_TRACE_PACKET, d + _int(_P_SEQ_ID, _SEQ)))
        for _, _, p in packets:
            out.write(p)
    return {"files": len(files), "slices": nslices, "flows": nflows, "tracks": len(descriptors) - len(files),
            "unpaired_sends": unpaired}


def wire_fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """One protobuf message's (field number, value): varints and fixed64 as int, length-delimited as bytes (for
    checking what convert wrote without Perfetto's own packages)."""
    out: list[tuple[int, int | bytes]] = []
    i = 0

    def varint() -> int:
        nonlocal i
        v = shift = 0
        while True:
            b = buf[i]
            i += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return v
    while i < len(buf):
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            out.append((field, varint()))
        elif wire == 1:
            out.append((field, struct.unpack_from("<Q", buf, i)[0]))
            i += 8
        elif wire == 2:
            n = varint()
            out.append((field, buf[i:i + n]))
            i += n
        else:
            raise TraceFormatError(f"protobuf wire type {wire} at byte {i}: not one convert writes")
    return out


def _packet(ts: int, event: bytes) -> bytes:
    return _bytes(_TRACE_PACKET, _int(_P_TIMESTAMP, ts) + _int(_P_SEQ_ID, _SEQ) + _bytes(_P_TRACK_EVENT, event))
