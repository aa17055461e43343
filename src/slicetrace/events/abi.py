"""Host <-> plugin contract: versions, event-type bits, states, descriptors and batch records.

Bit and state values are NCCL's (profiler v1..v7, NCCL 2.31) so events from real NCCL can flow through the
same host. slicetrace adds KernelStep at 1<<16 (PR #2316 used 1<<15, which v7 gave to KernelPhase) and
KernelStepStop = 32. Our native plugin version is 8 = "v7 + KernelStep".
This module imports nothing from slicetrace but errors.
"""
from __future__ import annotations

import enum
import operator
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from ..errors import PluginError


class EventType(enum.IntFlag):
    GROUP = 1 << 0
    COLL = 1 << 1
    P2P = 1 << 2
    PROXY_OP = 1 << 3
    PROXY_STEP = 1 << 4
    PROXY_CTRL = 1 << 5
    KERNEL_CH = 1 << 6
    NET_PLUGIN = 1 << 7
    GROUP_API = 1 << 8
    COLL_API = 1 << 9
    P2P_API = 1 << 10
    KERNEL_LAUNCH = 1 << 11
    CE_COLL = 1 << 12
    CE_SYNC = 1 << 13
    CE_BATCH = 1 << 14
    KERNEL_PHASE = 1 << 15
    KERNEL_STEP = 1 << 16


_TYPE_NAMES = {t.name.replace("_", "").lower(): int(t) for t in EventType}


# an integer as the README promises: decimal without a leading zero, or 0x hex (int(v, 0) also took 0o7, 0b11, 1_0,
# +3 and non-ASCII digits); the SLICETRACE_* integers and every event mask read this
INT_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*)|0[xX][0-9a-fA-F]+")


def parse_mask(text: str) -> int:
    """An event mask: an integer (decimal or 0x hex), or event type names joined by ',' or '|'
    (Coll|KernelStep, coll,kernel_step: case and '_' do not matter). ValueError names what is accepted."""
    t = text.strip()
    if INT_TEXT.fullmatch(t):
        return int(t, 0)
    if t[:1].isdigit() or t[:1] in ("+", "-"):      # a number (type names start with a letter), not one we take
        raise ValueError(f"{text!r} is not a decimal (no leading zero) or 0x hex integer")
    m = 0
    for name in text.replace("|", ",").split(","):
        bit = _TYPE_NAMES.get(name.strip().replace("_", "").lower())
        if bit is None:
            raise ValueError(f"{name.strip()!r} is not an event type, which are "
                             f"{', '.join(t.name for t in EventType)}")
        m |= bit
    return m


class State(enum.IntEnum):
    PROXY_OP_SEND_POSTED = 0
    PROXY_OP_SEND_REM_FIFO_WAIT = 1
    PROXY_OP_SEND_TRANSMITTED = 2
    PROXY_OP_SEND_DONE = 3
    PROXY_OP_RECV_POSTED = 4
    PROXY_OP_RECV_RECEIVED = 5
    PROXY_OP_RECV_TRANSMITTED = 6
    PROXY_OP_RECV_DONE = 7
    PROXY_STEP_SEND_GPU_WAIT = 8
    PROXY_STEP_SEND_WAIT = 9
    PROXY_STEP_RECV_WAIT = 10
    PROXY_STEP_RECV_FLUSH_WAIT = 11
    PROXY_STEP_RECV_GPU_WAIT = 12
    PROXY_CTRL_IDLE = 13
    PROXY_CTRL_ACTIVE = 14
    PROXY_CTRL_SLEEP = 15
    PROXY_CTRL_WAKEUP = 16
    PROXY_CTRL_APPEND = 17
    PROXY_CTRL_APPEND_END = 18
    PROXY_OP_IN_PROGRESS_V4 = 19
    PROXY_STEP_SEND_PEER_WAIT_V4 = 20
    NET_PLUGIN_UPDATE = 21
    KERNEL_CH_STOP = 22
    GROUP_START_API_STOP = 23
    GROUP_END_API_START = 24
    CE_COLL_START = 25
    CE_COLL_COMPLETE = 26
    CE_SYNC_START = 27
    CE_SYNC_COMPLETE = 28
    CE_BATCH_START = 29
    CE_BATCH_COMPLETE = 30
    KERNEL_PHASE_STOP = 31
    KERNEL_STEP_STOP = 32


NATIVE_VERSION = 8   # v7 + KernelStep
_T = EventType
# Event types each plugin version knows (cumulative, as NCCL's headers).
VERSION_TYPES: dict[int, int] = {
    1: _T.GROUP | _T.COLL | _T.P2P | _T.PROXY_OP | _T.PROXY_STEP | _T.PROXY_CTRL,
}
VERSION_TYPES[2] = VERSION_TYPES[1]
VERSION_TYPES[3] = VERSION_TYPES[2] | _T.KERNEL_CH | _T.NET_PLUGIN
VERSION_TYPES[4] = VERSION_TYPES[3]
VERSION_TYPES[5] = VERSION_TYPES[4] | _T.GROUP_API | _T.COLL_API | _T.P2P_API | _T.KERNEL_LAUNCH
VERSION_TYPES[6] = VERSION_TYPES[5] | _T.CE_COLL | _T.CE_SYNC | _T.CE_BATCH
VERSION_TYPES[7] = VERSION_TYPES[6] | _T.KERNEL_PHASE
VERSION_TYPES[8] = VERSION_TYPES[7] | _T.KERNEL_STEP
ALL_TYPES = VERSION_TYPES[NATIVE_VERSION]
# Bits each version's adapter clears from the plugin's mask, once, after its init (NCCL 2.31: v1..v4 leave the mask
# alone, v5 clears CE and KernelPhase, v6 KernelPhase), plus KernelStep for every older version (PR #2316's rule).
# Other bits stay in the plugin's mask; the host acts only on the types the version knows.
VERSION_CLEARED: dict[int, int] = {v: int(_T.KERNEL_STEP) for v in range(1, NATIVE_VERSION)}
VERSION_CLEARED[5] |= int(_T.CE_COLL | _T.CE_SYNC | _T.CE_BATCH | _T.KERNEL_PHASE)
VERSION_CLEARED[6] |= int(_T.KERNEL_PHASE)
VERSION_CLEARED[NATIVE_VERSION] = 0

_S = State
_PROXY_STEP_STATES = {_S.PROXY_STEP_SEND_GPU_WAIT, _S.PROXY_STEP_SEND_WAIT, _S.PROXY_STEP_RECV_WAIT,
                      _S.PROXY_STEP_RECV_FLUSH_WAIT, _S.PROXY_STEP_RECV_GPU_WAIT}
_PROXY_CTRL_STATES = {_S(v) for v in range(13, 19)}
# States each version is shown: NCCL's v1..v3 adapters forward only ProxyStep and ProxyCtrl states (not ProxyOp's).
VERSION_STATES: dict[int, frozenset[State]] = {
    1: frozenset(_PROXY_STEP_STATES | _PROXY_CTRL_STATES),
}
VERSION_STATES[2] = VERSION_STATES[1]
VERSION_STATES[3] = VERSION_STATES[2]
VERSION_STATES[4] = frozenset(VERSION_STATES[3] | {_S.PROXY_OP_IN_PROGRESS_V4, _S.PROXY_STEP_SEND_PEER_WAIT_V4,
                                                   _S.NET_PLUGIN_UPDATE, _S.KERNEL_CH_STOP})
VERSION_STATES[5] = frozenset(VERSION_STATES[4] | {_S.GROUP_START_API_STOP, _S.GROUP_END_API_START})
VERSION_STATES[6] = frozenset(VERSION_STATES[5] | {_S(v) for v in range(25, 31)})
VERSION_STATES[7] = frozenset(VERSION_STATES[6] | {_S.KERNEL_PHASE_STOP})
VERSION_STATES[8] = frozenset(VERSION_STATES[7] | {_S.KERNEL_STEP_STOP})

# Parent auto-inclusion (NCCL core emits a parent if any descendant bit is set), plus KernelStep under Coll/P2p.
_DESC_OF_TASK = _T.PROXY_OP | _T.PROXY_STEP | _T.KERNEL_CH | _T.NET_PLUGIN | _T.KERNEL_STEP | _T.KERNEL_PHASE
PARENT_RULES: dict[EventType, int] = {
    _T.GROUP_API: (_T.GROUP_API | _T.P2P_API | _T.COLL_API | _T.KERNEL_LAUNCH | _T.GROUP | _T.COLL | _T.P2P
                   | _DESC_OF_TASK | _T.CE_COLL | _T.CE_SYNC | _T.CE_BATCH),
    _T.COLL_API: _T.COLL_API | _T.COLL | _DESC_OF_TASK | _T.CE_COLL | _T.CE_SYNC | _T.CE_BATCH,
    _T.P2P_API: _T.P2P_API | _T.P2P | _DESC_OF_TASK,
    _T.GROUP: _T.GROUP | _T.COLL | _T.P2P | _DESC_OF_TASK,
    _T.COLL: _T.COLL | _DESC_OF_TASK,
    _T.P2P: _T.P2P | _DESC_OF_TASK,
    _T.PROXY_OP: _T.PROXY_OP | _T.PROXY_STEP | _T.NET_PLUGIN,
    _T.PROXY_STEP: _T.PROXY_STEP | _T.NET_PLUGIN,
    _T.CE_COLL: _T.CE_COLL | _T.CE_SYNC | _T.CE_BATCH,
    _T.KERNEL_CH: _T.KERNEL_CH | _T.KERNEL_PHASE,      # KernelPhase turns KernelCh on implicitly (v7)
}


_RULES = tuple((int(p), int(t)) for p, t in PARENT_RULES.items())


@lru_cache(maxsize=1024)     # called per op and plugin; masks are few and IntFlag arithmetic is slow
def effective_mask(mask: int) -> int:
    """The mask with every parent type whose descendants are requested."""
    mask = int(mask)
    out = mask
    for parent, trigger in _RULES:
        if mask & trigger:
            out |= parent
    return out


def check_version(version: Any, plugin: str = "") -> int:
    """A plugin's declared `version` as an int; PluginError (naming `plugin`, e.g. "'mod:attr'") unless an int in
    VERSION_TYPES: True == 1 and 5.0 == 5 as dict keys, but a bool or a float is no version."""
    v = 0
    if not isinstance(version, bool):
        try:
            v = operator.index(version)
        except TypeError:
            pass
    if v not in VERSION_TYPES:
        who = f"{plugin} " if plugin else ""
        raise PluginError(f"profiler plugin {who}has version={version!r}; accepted: an int in {sorted(VERSION_TYPES)} "
                          f"({NATIVE_VERSION} = v7 + KernelStep)")
    return v


# ---- descriptors (field names follow NCCL's v7 descriptors in snake_case) ----

@dataclass
class Descriptor:
    type: EventType
    parent: Any = None        # parent handle returned by the same plugin, or None
    rank: int = 0
    ts_ns: int = 0            # host timeline (CLOCK_MONOTONIC ns) of the event's start


@dataclass
class GroupApiDescr(Descriptor):
    graph_captured: bool = False
    group_depth: int = 1


@dataclass
class CollApiDescr(Descriptor):
    func: str = ""
    count: int = 0
    datatype: str = ""
    root: int = 0
    stream: Any = None
    graph_captured: bool = False
    user_tag: int = 0


@dataclass
class P2pApiDescr(Descriptor):
    func: str = ""
    count: int = 0
    datatype: str = ""
    stream: Any = None
    graph_captured: bool = False
    user_tag: int = 0


@dataclass
class KernelLaunchDescr(Descriptor):
    stream: Any = None


@dataclass
class GroupDescr(Descriptor):
    pass


@dataclass
class CollDescr(Descriptor):
    seq_number: int = 0
    func: str = ""
    send_buff: int = 0
    recv_buff: int = 0
    count: int = 0
    root: int = 0
    datatype: str = ""
    n_channels: int = 0
    n_warps: int = 0
    algo: str = "RING"
    proto: str = "SIMPLE"
    parent_group: Any = None
    user_tag: int = 0
    kernel_variant: str = ""
    is_sym_coll: bool = False
    comm_hash: int = 0        # native only: v4..v7 get it at init, v1..v3 a 0 (NCCL's adapters: "removed in v4")


@dataclass
class P2pDescr(Descriptor):
    func: str = ""
    buff: int = 0
    datatype: str = ""
    count: int = 0
    peer: int = 0
    n_channels: int = 0
    parent_group: Any = None
    user_tag: int = 0
    comm_hash: int = 0


@dataclass
class ProxyCtrlDescr(Descriptor):
    pass


@dataclass
class KernelChDescr(Descriptor):
    channel_id: int = 0
    p_timer: int = 0          # GPU/device start clock, ns


@dataclass
class KernelStepDescr(Descriptor):
    channel_id: int = 0
    is_send: bool = False
    peer: int = 0
    step: int = 0
    size: int = 0
    wait: int = 0             # device clock: wait for credit/data began
    ready: int = 0            # device clock: wait satisfied, copy began
    done: int = 0             # device clock: slice posted (also in KernelStepStop args)


@dataclass
class StateArgs:
    """The v4+ state-args union, flattened."""
    trans_size: int = 0               # proxyStep
    appended_proxy_ops: int = 0       # proxyCtrl
    data: Any = None                  # netPlugin
    p_timer: int = 0                  # kernelCh / kernelPhase / kernelStep stop clock
    ts_ns: int = 0                    # host timeline of the state change


@dataclass(frozen=True)
class CommInfo:
    """What init() receives from version 4 on, as NCCL's: comm id/hash, name, node count, ranks, rank (NCCL's v1..v3
    init takes no communicator: those versions get None)."""
    comm_hash: int
    comm_name: str
    n_nodes: int
    n_ranks: int
    rank: int
    backend: str = "cpu"
    extra: dict = field(default_factory=dict)   # e.g. {"clock_uncertainty_ns": 40}


class ActivationMask:
    """NCCL passes `int*`: the plugin writes it at init and may change it at any time."""
    __slots__ = ("value",)

    def __init__(self, value: int = 0):
        self.value = int(value)


# KernelStep records for the batch entry point: one row per slice.
KERNEL_STEP_DTYPE = np.dtype([
    ("channel", "<u2"), ("is_send", "u1"), ("peer", "<i4"), ("step", "<u8"), ("size", "<u8"),
    ("wait_clk", "<u8"), ("ready_clk", "<u8"), ("done_clk", "<u8"),      # raw device clocks, ns
    ("wait_ns", "<i8"), ("ready_ns", "<i8"), ("done_ns", "<i8"),         # host timeline, CLOCK_MONOTONIC ns
], align=True)    # 72 bytes; aligned fields copy several times faster than packed ones

# KernelCh batch rows (plugins with `kernel_ch_batch`): one row per channel program, start and stop together.
KERNEL_CH_DTYPE = np.dtype([
    ("channel", "<u2"), ("is_send", "u1"), ("peer", "<i4"),
    ("start_clk", "<u8"), ("stop_clk", "<u8"),                            # raw device clocks, ns (p_timer)
    ("start_ns", "<i8"), ("stop_ns", "<i8"),                              # host timeline, CLOCK_MONOTONIC ns
], align=True)

# our function names -> NCCL's, as descriptors, traces and Inspector lines name them (busbw factors: plan.traffic).
FUNC_NAMES = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
              "broadcast": "Broadcast", "reduce": "Reduce", "send": "Send", "recv": "Recv",
              "all_to_all": "AlltoAll", "send_recv": "SendRecv"}
DATATYPE_NAMES = {"int8": "ncclInt8", "uint8": "ncclUint8", "int32": "ncclInt32", "uint32": "ncclUint32",
                  "int64": "ncclInt64", "uint64": "ncclUint64", "float16": "ncclFloat16",
                  "float32": "ncclFloat32", "float64": "ncclFloat64", "bfloat16": "ncclBfloat16"}


def fused_pairs(recs: np.ndarray, *keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices (receive, send) of the two directions of each fused slice (one primitive's receive and send:
    equal `keys` and done clock, exactly two records). `keys` (arrays, most significant first) tell ranks, ops
    and channels apart."""
    if len(recs) < 2:
        return np.zeros(0, np.intp), np.zeros(0, np.intp)
    o = np.lexsort((recs["done_ns"],) + keys[::-1])
    done, snd = recs["done_ns"][o], recs["is_send"][o]
    eq = done[1:] == done[:-1]
    for k in keys:
        k = k[o]
        eq &= k[1:] == k[:-1]
    alone = np.concatenate(([True], ~eq[:-1])) & np.concatenate((~eq[1:], [True]))   # groups of exactly two
    i = np.flatnonzero(eq & alone & (snd[1:] != snd[:-1]))
    first_sends = snd[i] != 0
    return np.where(first_sends, o[i + 1], o[i]), np.where(first_sends, o[i], o[i + 1])


def moving_from(recs: np.ndarray, *keys: np.ndarray, pairs: tuple | None = None) -> np.ndarray:
    """When each KernelStep's slice could move: its ready_ns, or for the two directions of a fused slice
    (fused_pairs, or `pairs` when the caller has them) the later of their two ready clocks. On the GPU a fused
    slice waits for credit and data at once; a send with room but no data yet is waiting, not moving."""
    start = recs["ready_ns"].astype(np.int64)
    r, s = fused_pairs(recs, *keys) if pairs is None else pairs
    later = np.maximum(start[r], start[s])
    start[r] = later
    start[s] = later
    return start


# Counters of "slicetrace_counters" that count what was kept, skipped on purpose or measured, not lost.
_NOT_LOST = ("sampled_out", "masked_out")
_NOT_LOST_PREFIX = ("delivered", "unrecorded_", "plugin_written", "clock_", "ops_")


def lost_counters(counters: dict[str, Any]) -> dict[str, int]:
    """The loss counters among a rank's counters that are not zero (report's "loss counters" line, the trace's
    process name)."""
    return {k: v for k, v in counters.items() if v and k not in _NOT_LOST and not k.startswith(_NOT_LOST_PREFIX)}


def process_label(rank: int, comm_hash: int, lost: dict[str, int] | None = None, failed: str | None = None) -> str:
    """A rank's process name in a trace viewer; with the error class an op of it failed in, and its losses
    (lost_counters), which a viewer shows nowhere else."""
    name = f"rank {rank} (comm {comm_hash})" + (f" failed: {failed}" if failed else "")
    return name + ((";" if failed else "") + " lost: " + ", ".join(f"{k} {v:,}" for k, v in lost.items())
                   if lost else "")
