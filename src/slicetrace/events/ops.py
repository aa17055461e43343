"""What the event host tracks per op: the op and task descriptions the wiring hands over, per-plugin
handles, completion counts, and the PAIRED -> KERNEL_STEP / KERNEL_CH record conversions."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..stamps.layout import FLAG_SEND, PAIRED_DTYPE, take_rows
from .abi import KERNEL_CH_DTYPE, KERNEL_STEP_DTYPE
from .plugin import LoadedPlugin, PartialDelivery

# PartialDelivery is re-exported for emit, which may not import events.plugin (tests/unit/test_layers.py).
__all__ = ["OpInfo", "TaskInfo", "PartialDelivery", "to_kernel_steps", "to_kernel_ch"]

P2P_FUNCS = ("Send", "Recv")
OFF = object()           # event type not emitted to this plugin (not in its mask)
SKIP = object()          # EventHost._kch_parent: nothing to deliver to this plugin
_KS_BYTES = KERNEL_STEP_DTYPE.itemsize
assert all(PAIRED_DTYPE.fields[p][:2] == KERNEL_STEP_DTYPE.fields[k][:2] for p, k in (
    ("channel", "channel"), ("peer", "peer"), ("step", "step"), ("size", "size"), ("wait", "wait_clk"),
    ("ready", "ready_clk"), ("done", "done_clk"), ("wait_ns", "wait_ns"), ("ready_ns", "ready_ns"),
    ("done_ns", "done_ns"))) and PAIRED_DTYPE.fields["flags"][1] == KERNEL_STEP_DTYPE.fields["is_send"][1]


@dataclass(slots=True)
class TaskInfo:
    """One Coll (the op's only task) or one p2p part (routed by (peer, is_send))."""
    func: str = "AllReduce"
    peer: int = -1
    is_send: bool = False
    count: int = 0
    datatype: str = "ncclFloat32"
    root: int = 0
    send_buff: int = 0
    recv_buff: int = 0
    n_programs: int = 1      # KernelCh records that complete this task (0: completes at end_op)
    channels: tuple = ()     # p2p: the stamp channels of this task's programs (() = any); tells apart the
                             # records of two parts of one group to the same peer in the same direction
    user_tag: int | None = None     # this call's own tag (a group's send/recv each have one); None: the op's
    variant: str = ""        # a symmetric kernel's name (plan.symmetric.VARIANTS); '': the Simple ring


@dataclass(slots=True)
class OpInfo:
    tag: int
    func: str
    tasks: list[TaskInfo] = field(default_factory=list)
    seq_number: int = 0
    user_tag: int = 0
    mask: int | None = None  # snapshot of host.op_mask(); None = take it in begin_op
    ts_ns: int = 0
    n_warps: int = 1
    stream: Any = None
    group_depth: int = 1


# api.py builds these by position, in this order
assert list(TaskInfo.__dataclass_fields__)[:9] == ["func", "peer", "is_send", "count", "datatype", "root", "send_buff",
                                                  "recv_buff", "n_programs"]
assert list(OpInfo.__dataclass_fields__) == ["tag", "func", "tasks", "seq_number", "user_tag", "mask", "ts_ns",
                                             "n_warps", "stream", "group_depth"]

# What happened to records offered to one plugin: each plugin's trace or metrics report its own (two plugins
# must not each claim the other's deliveries); the rank's counters() sums them.
PER_PLUGIN = ("parent_dropped", "pool_full", "plugin_error", "plugin_disabled", "declined")


class _Slot:
    __slots__ = ("lp", "failures", "disabled", "counts")

    def __init__(self, lp: LoadedPlugin):
        self.lp, self.failures, self.disabled = lp, 0, False
        self.counts: dict[str, int] = dict.fromkeys(PER_PLUGIN, 0)     # and delivered_<type>


class _Task:
    __slots__ = ("info", "p2p", "key", "chans", "mates", "handles", "left", "last_done", "done")

    def __init__(self, info: TaskInfo, nslots: int):
        self.info = info
        self.p2p = info.func in P2P_FUNCS
        self.key = info.peer * 2 + (1 if info.is_send else 0)
        self.chans: np.ndarray | None = None     # set by _Op._share, only where a key is shared
        self.mates: list[_Task] | None = None
        self.handles: list[Any] = [OFF] * nslots
        self.left, self.last_done, self.done = info.n_programs, 0, False


class _Op:
    __slots__ = ("info", "pmasks", "pm_any", "tasks", "groups", "open", "shared", "n_p2p")

    def __init__(self, info: OpInfo, pmasks: tuple[int, ...]):
        self.info, self.pmasks = info, pmasks
        pm_any = 0
        for pm in pmasks:
            pm_any |= pm
        self.pm_any = pm_any                     # union of pmasks: records no plugin takes are masked_out
        nslots = len(pmasks)
        self.groups: list[Any] = [OFF] * nslots
        ti = info.tasks
        if len(ti) == 1:                         # a collective (or a group of one part): no list comprehension
            t = _Task(ti[0], nslots)
            self.tasks, self.open, self.n_p2p, self.shared = [t], 1, 1 if t.p2p else 0, False
            return
        self.tasks = tasks = [_Task(t, nslots) for t in ti]
        self.open = n = len(tasks)
        self.n_p2p = sum(1 for t in tasks if t.p2p)
        self.shared = n > 1 and self._share()

    def _share(self) -> bool:
        """True when two p2p parts share (peer, is_send), so records need their channels to find a task.
        Parts of one group to the same peer in the same direction whose records cannot be told apart (linked by
        channels in common, or channels unknown) are mates: the first (lead) takes every record on their
        channels, counts all their KernelCh records, and they all end together at the last one (no record
        delivered twice, every record inside its parent). _route skips the other mates."""
        by_key: dict[int, list[_Task]] = {}
        for t in self.tasks:
            if t.p2p:
                by_key.setdefault(t.key, []).append(t)
        shared = False
        for same in by_key.values():
            if len(same) < 2:
                continue
            shared = True
            if not all(t.info.channels for t in same):
                groups: list[tuple[list[_Task], set]] = [(same, set())]    # lead.chans None: all of the key
            else:
                groups = []                  # parts linked by a common channel, in task order
                for t in same:
                    members, chans = [t], set(t.info.channels)
                    for g in [g for g in groups if g[1] & chans]:
                        groups.remove(g)
                        members, chans = g[0] + members, g[1] | chans
                    groups.append((sorted(members, key=same.index), chans))
            for members, chans in groups:
                lead = members[0]
                lead.chans = np.array(sorted(chans), dtype=np.int64) if chans else None
                if len(members) == 1:
                    continue
                lead.left = sum(t.info.n_programs for t in members)
                for t in members:
                    t.mates = members
                    if t is not lead:
                        t.left = 0
        return shared


def to_kernel_steps(recs: np.ndarray) -> np.ndarray:
    """PAIRED_DTYPE KernelStep records -> abi.KERNEL_STEP_DTYPE: a read-only view of each row's first 72 bytes
    (the drain leaves FLAG_SEND alone in flags, which is is_send's byte); no copy."""
    recs = np.ascontiguousarray(recs)
    out = np.ndarray((len(recs),), KERNEL_STEP_DTYPE, recs, 0, (PAIRED_DTYPE.itemsize,))
    out.flags.writeable = False          # shared by every plugin of the fan-out
    return out


def to_kernel_ch(recs: np.ndarray) -> np.ndarray:
    """PAIRED_DTYPE KernelCh records (ready = start, done = stop) -> abi.KERNEL_CH_DTYPE."""
    out = np.empty(len(recs), KERNEL_CH_DTYPE)
    out["channel"] = recs["channel"]
    out["is_send"] = recs["flags"] & FLAG_SEND
    out["peer"] = recs["peer"]
    out["start_clk"], out["stop_clk"] = recs["ready"], recs["done"]
    out["start_ns"], out["stop_ns"] = recs["ready_ns"], recs["done_ns"]
    out.flags.writeable = False          # shared by every plugin of the fan-out
    return out


def convert(fn: Any, recs: np.ndarray, whole: Any, sel: Any) -> np.ndarray:
    """fn (to_kernel_steps, to_kernel_ch) of recs' rows `sel` (None: all). whole = (box, the poll's records, a, b)
    when recs are rows a..b of an EventHost.batch() poll: that poll is converted once (into box[0]), views handed out."""
    if whole is None:
        return fn(recs if sel is None else take_rows(recs, sel))
    box, all_recs, a, b = whole
    if box[0] is None:
        box[0] = fn(all_recs)
    ks = box[0][a:b]
    return ks if sel is None else take_rows(ks, sel)
