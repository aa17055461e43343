"""`slicetrace convert`'s tracks: per rank (and communicator) a process, in it a track of the rank's own that
orders its slices' tracks (operations, then by channel), and the lanes that keep overlapping slices apart. The
descriptors' fields: analyze/protobuf.py's track_descriptor."""
from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np

from ..events.abi import process_label
from .protobuf import CHILD_EXPLICIT, PID_MAX, PROCESS_ORDERING_EXPLICIT, track_descriptor

INSTANT = 3                     # TrackEvent.Type
_MARKS = (None, "send done", "recv ready")  # the flow's instants, by flow code (1: start, 2: end)


def uuid64(*parts: Any) -> int:
    """A stable 64-bit id for a track or a flow."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") or 1


def process_uuid(f: Any) -> int:
    """The track of file f's process (a rank of a communicator): its descriptor's, and its failures' instants'."""
    return uuid64("proc", f.comm, f.rank)


def root_descriptor() -> bytes:
    """The implicit root track's (uuid 0) descriptor: its process_ordering EXPLICIT has Perfetto (v57 and later)
    order the processes by their sibling_order_rank, which it ignores otherwise (its own order: by activity)."""
    return track_descriptor(0, process_ordering=PROCESS_ORDERING_EXPLICIT)


def layout(f: Any, pid: int, place: int, descriptors: list[bytes], pre: dict[tuple, int], mark: np.ndarray,
           ) -> tuple[np.ndarray, ...]:
    """Each slice's place: slices that would overlap on a track get a lane (a track of its own), lanes first fit in
    begin order. Returns that order and each slice's begin, end and flow instant (mark: 0 none, else _MARKS's)
    event's head (an id in `pre`: track, name, category; track; track, name, INSTANT); appends the process's, its
    rank track's and the lanes' descriptors. Perfetto ignores the order of a process track's children (they show
    as its siblings), so the lanes sit in a track of the rank's own that orders them: operations, then by channel
    (_track_order); the process has its place among the processes (`place`: places())."""
    proc, group = process_uuid(f), uuid64("rank", f.comm, f.rank)
    descriptors.append(track_descriptor(proc, process=(pid, process_label(f.rank, f.comm, f.lost, f.failed)),
                                        order_rank=place))
    descriptors.append(track_descriptor(group, f"rank {f.rank}", proc, child_ordering=CHILD_EXPLICIT))
    made: list[tuple[tuple, int, str]] = []     # each lane's (place, uuid, name)
    ends_of: dict[int, list[int]] = {}      # track -> end of the last slice of each lane
    flat: dict[int, list[int]] = {}         # ... the instant of its last slice if that one had no length, else -1
    uid_of: dict[tuple[int, int], int] = {}
    head_of: dict[tuple, tuple[int, int]] = {}     # (track, lane, name, cat) -> its begin's and end's heads
    order = np.lexsort((-f.t1, f.t0))       # by begin, longest first; stable
    t0s, t1s, trs, names, cats = f.t0.tolist(), f.t1.tolist(), f.track.tolist(), f.name.tolist(), f.cat.tolist()
    heads = [0] * len(t0s) * 3
    marks = mark.tolist()
    for si in order.tolist():
        t0, t1, tr = t0s[si], t1s[si], trs[si]
        ends = ends_of.get(tr)
        if ends is None:
            ends, zs = ends_of[tr], flat[tr] = [], []
        else:
            zs = flat[tr]
        # two zero-length slices at one instant on one lane would come out begin, begin, end, end: nested
        if ends and ends[0] <= t0 and not (t1 <= t0 and zs[0] == t0):
            lane = 0                        # the common case, without the generator
        else:
            lane = next((i for i, e in enumerate(ends) if e <= t0 and not (t1 <= t0 and zs[i] == t0)), len(ends))
        if lane == len(ends):
            name = f.strs[tr]
            uid = uid_of[(tr, lane)] = uuid64("track", f.comm, f.rank, name, lane)
            ends.append(t1)
            zs.append(-1)
            made.append(((_track_order(name), lane), uid, name if lane == 0 else f"{name} #{lane}"))
        ends[lane], zs[lane] = t1, (t0 if t1 <= t0 else -1)
        k = (tr, lane, names[si], cats[si])
        h = head_of.get(k)
        if h is None:
            uid = uid_of[(tr, lane)]
            h = head_of[k] = (pre.setdefault((uid, f.strs[k[2]], f.strs[k[3]]), len(pre)),
                              pre.setdefault((uid,), len(pre)))
        heads[3 * si], heads[3 * si + 1] = h
        if marks[si]:                       # on the slice's own lane: it nests in the slice
            heads[3 * si + 2] = pre.setdefault((uid_of[(tr, lane)], _MARKS[marks[si]], INSTANT), len(pre))
    for i, (_, uid, name) in enumerate(sorted(made)):
        descriptors.append(track_descriptor(uid, name, group, order_rank=i))
    heads_a = np.array(heads, np.int32).reshape(-1, 3)
    return order, heads_a[:, 0], heads_a[:, 1], heads_a[:, 2]


def _track_order(name: str) -> tuple:
    """A track's place in its rank: the operations first, then by name with its numbers read as numbers (ch 2
    before ch 10; in a channel its programs, then receives and sends by peer)."""
    return name != "operations", [int(p) if i % 2 else p for i, p in enumerate(re.split(r"(\d+)", name))]


def places(files: list) -> list[int]:
    """Each file's place among the processes (0 on top): communicators in the order of their first op (their
    first slice where none was recorded; then by hash), each one's ranks together in rank order."""
    first: dict[str, float] = {}
    for f in files:
        ops = f.track == f.strs.index("operations") if "operations" in f.strs else np.zeros(0, bool)
        t = f.t0[ops].min() if ops.any() else f.t0.min() if len(f.t0) else np.inf
        first[f.comm] = min(first.get(f.comm, np.inf), float(t))
    order = sorted(range(len(files)), key=lambda i: (first[files[i].comm], files[i].comm, files[i].rank))
    out = [0] * len(files)
    for p, i in enumerate(order):
        out[i] = p
    return out


def pids(files: list, place: list[int]) -> list[int]:
    """Each file's ProcessDescriptor.pid: rank + 1 (pid 0 is Perfetto's idle process), or, where that would pass
    int32 or two communicators' ranks would share it, its place + 1 (the process name keeps rank and comm)."""
    if all(f.rank < PID_MAX for f in files) and len({f.comm for f in files}) == 1:
        return [f.rank + 1 for f in files]
    return [p + 1 for p in place]
