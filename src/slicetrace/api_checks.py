"""The API's argument checks, shared by its operations: each error names the parameter, the value and what is
accepted (UsageError), before anything is sent."""
from __future__ import annotations

import math
import operator
import os
import threading
from collections.abc import Mapping, Set
from typing import Any

import numpy as np

from .backend.base import REDOPS, host_pointer
from .errors import UsageError, comm_label, plural
from .events.abi import ALL_TYPES, FUNC_NAMES, parse_mask


# NCCL's groups may also hold collectives; ours batch point-to-point only (all_to_all is sends and receives)
GROUPED = "only send, recv and all_to_all may be grouped; call collectives outside the group"


def comm_named(e: BaseException, sess: Any) -> BaseException:
    """e, its message ending with which communicator it came from (session `sess`'s: comm_hash as its traces show
    it, and name): a process may hold several, each numbering its collectives from 1. Once, at the end."""
    tag = f" [{comm_label(sess.comm_hash, sess.name)}]"
    if e.args and isinstance(e.args[0], str):
        e.args = (e.args[0].replace(tag, "") + tag,) + e.args[1:]
    return e


def told(e: BaseException, sess: Any) -> None:
    """e, an op's PeerError or MismatchError, told to session `sess`'s profiler plugins (comm_failed): a failed rank's
    trace says why it stopped. The op named is the one e is credited to (errors.credit): the op whose submit raised
    it, or the earlier op a backend found it belongs to; a failure found elsewhere (a barrier, synchronize, an
    unprofiled op) goes without one."""
    if sess.host is None:
        return
    func, seq = getattr(e, "failed_op", None) or (None, -1)
    sess.host.failed(type(e).__name__, str(e), None if func is None else FUNC_NAMES.get(func, func),
                     seq if func is not None and seq >= 0 else None)


def writable(buf: Any, what: str) -> None:
    """Results land in it: a read-only numpy array is refused before the op, not half way through it."""
    if not getattr(getattr(buf, "flags", None), "writeable", True):
        raise UsageError(f"{what} is read-only (flags.writeable is False); results are written into it")


# torch.distributed.ReduceOp's members by name (a training script passes them): NCCL's five reductions
_TORCH_OPS = {"SUM": "sum", "PRODUCT": "prod", "MIN": "min", "MAX": "max", "AVG": "avg"}
# every name op= takes, lowercased: ours and torch's ('SUM', as ReduceOp prints it; 'product')
_OP_NAMES = {**{r: r for r in REDOPS}, **{k.lower(): v for k, v in _TORCH_OPS.items()}}


def redop_name(op: Any) -> str:
    """A reduction: one of REDOPS or torch.distributed.ReduceOp's names, in any case ('SUM'), or a ReduceOp member
    (torch.distributed.ReduceOp.SUM, ...), as its name here; else a UsageError."""
    from_torch = type(op).__module__.startswith("torch")
    if from_torch and getattr(op, "name", None) in _TORCH_OPS:
        return _TORCH_OPS[op.name]
    name = _OP_NAMES.get(op.lower()) if isinstance(op, str) else None   # `in` on a numpy array compares element-wise
    if name is None:
        hint = f" (any case; torch.distributed.ReduceOp's names {', '.join(_TORCH_OPS)} too)" if not from_torch else (
            f"; of torch.distributed.ReduceOp, {', '.join(_TORCH_OPS)} are taken (a ReduceOp made by a call, as "
            f"for PREMUL_SUM, is not)")
        raise UsageError(f"op={op!r} is not one of {REDOPS}{hint}")
    return name                         # a plain str: str() of a (str, Enum) member is its 'Cls.NAME'


_TAG_LIMIT = 1 << 63        # user tags with the top bit set are NCCL's own (ncclCollConfig_t.userProfilerTag)


def as_index(v: Any) -> int | None:
    """An int or an integer numpy scalar as a plain int; None for anything else (a bool too)."""
    if isinstance(v, bool):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def int_index(v: Any, name: str, limit: int, accepted: str = "") -> int:
    """An integer (Python or numpy, not bool) in 0..limit-1, else a UsageError naming it."""
    i = as_index(v)
    if i is not None and 0 <= i < limit:
        return i
    raise UsageError(f"{name}={v!r} must be an int in 0..{limit - 1}{accepted}")


def split_counts(v: Any, name: str, world: int) -> list[int]:
    """all_to_all's per-rank counts: world non-negative integers (a list, tuple or 1-D integer array)."""
    try:        # a dict iterates its keys and a set in no set order: neither is counts in rank order
        items = list(v) if not isinstance(v, (str, bytes, Mapping, Set)) else None
    except TypeError:
        items = None
    counts = [as_index(c) for c in items] if items is not None else []
    if items is None or len(items) != world or any(c is None or c < 0 for c in counts):
        raise UsageError(f"{name}={v!r} must be {world} non-negative ints, one per rank (world_size={world}), in "
                         f"rank order: a list, tuple or 1-D integer array")
    return counts


def a2a_counts(n: int, send_counts: Any, recv_counts: Any, rank: int, w: int) -> tuple[list[int], list[int]]:
    """all_to_all's (send, recv) counts per rank: equal blocks of x, or the caller's split sizes, checked."""
    if send_counts is None and recv_counts is None:
        if n % w:
            raise UsageError(f"all_to_all input has {plural(n, 'element')}, not a multiple of world_size={w} (pass "
                             f"send_counts and recv_counts for blocks of different sizes)")
        return [n // w] * w, [n // w] * w
    if send_counts is None or recv_counts is None:
        given, missing = ("send_counts", "recv_counts") if recv_counts is None else ("recv_counts", "send_counts")
        raise UsageError(f"all_to_all: {given} given without {missing}; pass both or neither")
    sends = split_counts(send_counts, "send_counts", w)
    recvs = split_counts(recv_counts, "recv_counts", w)
    if sum(sends) != n:
        raise UsageError(f"all_to_all: x has {plural(n, 'element')} but send_counts={sends} sum to {sum(sends)}")
    if sends[rank] != recvs[rank]:
        raise UsageError(f"all_to_all: rank {rank} sends itself {plural(sends[rank], 'element')} "
                         f"(send_counts[{rank}]) but receives {recvs[rank]} (recv_counts[{rank}]); "
                         f"they must be equal")
    return sends, recvs


def seconds_or_none(v: Any, name: str, none_means: str) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf):
        raise UsageError(f"{name}={v!r} must be a finite number of seconds > 0, or None for {none_means}")


def no_stream_on_cpu(func: str, stream: Any, backend: str) -> None:
    """A cpu op is done when it returns, on no stream: a stream given there was ignored, and its events reported it
    as the stream the op ran on. Refused, as a CuPy array is there (null, the tests' backend, takes any)."""
    if stream is not None and backend == "cpu":
        raise UsageError(f"{func}: stream={stream!r}, but the cpu backend has no streams (its ops are complete when "
                         f"they return); leave stream= out (None) on cpu: it picks the CUDA stream on backend='cuda'")


def tag_value(v: Any) -> int:
    return v if v.__class__ is int and 0 <= v < _TAG_LIMIT else int_index(
        v, "user_tag", _TAG_LIMIT, " (2**63 - 1; tags with the top bit set are reserved, as in NCCL)")


def ptr(buf: Any) -> int:
    """A buffer's address: numpy, CuPy (.data.ptr), torch (.data_ptr()), the cuda backend's RawBuf (.ptr), or
    anything with .ctypes.data; 0 when unknown."""
    if isinstance(buf, np.ndarray):
        return host_pointer(buf)
    for get in (lambda b: b.data.ptr, lambda b: b.data_ptr(), lambda b: b.ptr, lambda b: b.ctypes.data):
        try:
            return int(get(buf))
        except Exception:
            continue
    return 0


def check_group_overlap(entries: list, itemsize: int) -> None:
    """A receive sharing memory with another part of its group would be written while that part is read or
    written (results depend on timing; NCCL leaves it undefined): refused. Sends may share memory; a buffer whose
    address is unknown (0) is not checked."""
    if len(entries) == 2:                       # the common send + recv pair, without the general sweep
        (p, b, _, _), (q, c, _, _) = entries
        if (p.is_send and q.is_send) or not p.count or not q.count:
            return
        if b is not c and b.__class__ is np.ndarray and c.__class__ is np.ndarray and not np.may_share_memory(b, c):
            return                              # separate numpy arrays (~0.2 us; the addresses cost more)
        pa = ptr(b)
        qa = pa if c is b else ptr(c)
        if not pa or not qa or (pa + p.offset * itemsize >= qa + (q.offset + q.count) * itemsize
                                or qa + q.offset * itemsize >= pa + (p.offset + p.count) * itemsize):
            return
    elif all(p.is_send for p, _, _, _ in entries):
        return
    addr: dict[int, int] = {}
    spans = []
    for p, b, _, _ in entries:
        if p.count:
            a = addr.get(id(b))
            if a is None:
                a = addr[id(b)] = ptr(b)
            if a:
                spans.append((a + p.offset * itemsize, a + (p.offset + p.count) * itemsize, p))
    spans.sort(key=lambda c: c[:2])
    cluster, end = [], -1
    for span in spans + [(1 << 64, 1 << 64, None)]:
        if span[0] >= end:                      # a cluster of overlapping spans ends: any receive in it overlaps
            recv = next((c for c in cluster if not c[2].is_send), None) if len(cluster) > 1 else None
            if recv is not None:
                other = next(c for c in cluster if c is not recv and c[0] < recv[1] and recv[0] < c[1])
                what = lambda c: f"{'send' if c[2].is_send else 'recv'}(peer={c[2].peer})"     # noqa: E731
                raise UsageError(f"send/recv group: the buffer of {what(recv)} overlaps that of {what(other)} "
                                 f"({recv[0] - other[0]:+d} bytes from it); a receive may not share memory with "
                                 f"another send or receive of its group: pass separate buffers")
            cluster = []
        cluster.append(span)
        end = max(end, span[1])


def check_overlap(func: str, send: Any, recv: Any, count: int, rank: int) -> None:
    """x and out that share memory must be NCCL's in-place layout: any other overlap gives wrong results."""
    if not send.size or not recv.size:
        return
    if send.__class__ is np.ndarray and recv.__class__ is np.ndarray and not np.may_share_memory(send, recv):
        return                      # apart (their bounds: ~0.3 us; the two addresses cost ~1 us)
    sp, rp = ptr(send), ptr(recv)
    if not (sp < rp + recv.nbytes and rp < sp + send.nbytes):
        return
    lo, hi = rank * count, (rank + 1) * count
    if func == "all_gather":
        ok, want = sp == rp + lo * send.itemsize, f"x is out[{lo}:{hi}] (this rank's block)"
    elif func == "reduce_scatter":
        ok, want = rp == sp + lo * send.itemsize, f"out is x[{lo}:{hi}] (this rank's block)"
    elif func == "all_to_all":
        raise UsageError("all_to_all: x and out overlap; it has no in-place form (a block could be overwritten "
                         "before it is sent): pass an out that does not overlap x, or none")
    else:
        ok, want = sp == rp, "out is x"
    if not ok:
        where = (f"{abs(sp - rp):,} bytes {'after' if sp > rp else 'before'} out's start" if sp != rp
                 else "at out's start")
        raise UsageError(f"{func}: x and out overlap without being in place (x starts {where}); in place "
                         f"means {want}; otherwise pass buffers that do not overlap")


def check_self_types(entries: list, rank: int) -> None:
    """A group of mixed dtypes moves bytes: its sends to self and receives from self (paired in order, as the plan
    pairs them) must still agree in count and dtype, as a pair between two ranks must (MismatchError there)."""
    sends = [(p.count, dt) for p, _, dt, _ in entries if p.peer == rank and p.is_send]
    recvs = [(p.count, dt) for p, _, dt, _ in entries if p.peer == rank and not p.is_send]
    for k, (s, r) in enumerate(zip(sends, recvs)):
        if s != r:
            raise UsageError(f"send to self #{k} on rank {rank} is {s[0]} x {s[1]} but the recv from self it pairs "
                             f"with is {r[0]} x {r[1]}; paired counts and dtypes must be equal")


_OPEN = threading.local()       # this thread's open comm.group()s, innermost last
if hasattr(os, "register_at_fork"):     # a forked child's communicators start with no group open
    os.register_at_fork(after_in_child=lambda: _OPEN.__dict__.pop("stack", None))


def group_opened(comm: Any, opening: bool) -> None:
    """comm's outermost group opens (opening) or ends in this thread."""
    stack = _OPEN.__dict__.setdefault("stack", [])
    if opening:
        comm._group_owner = threading.get_ident()
        stack.append(comm)
    elif comm in stack:
        stack.remove(comm)


def outside_groups(comm: Any, what: str, span: bool = True) -> None:
    """Refuse an op of comm inside another communicator's group (ours do not span communicators, NCCL's do: it
    would run at once, before the group's own ops it may need) or while another thread has comm's group open
    (its call would join that group and return before its data moved). span=False: comm's own group may open."""
    stack = _OPEN.__dict__.get("stack")
    if span and stack and stack[-1] is not comm and comm._group is None:
        raise UsageError(f"{what} on one communicator inside another communicator's comm.group(): slicetrace's "
                         f"groups do not span communicators (NCCL's do); group each one's calls in its own group")
    if comm._group is not None and comm._group_owner != threading.get_ident():
        raise UsageError(f"{what}: another thread has comm.group() open on this communicator; a group's calls "
                         f"come from the thread that opened it")


def profile_mask(mask: Any) -> int | None:
    """comm.profiling()'s mask: EventType bits, type names ('Coll|KernelCh'), or None (no limit)."""
    given = mask
    if isinstance(mask, str):
        try:
            mask = parse_mask(mask)
        except ValueError as e:
            raise UsageError(f"mask={mask!r}: {e}") from None
    if mask is None:
        return None
    m = as_index(mask)                  # numpy ints too, as Settings' profile_event_mask takes them
    if m is None or m < 0:
        raise UsageError(f"mask={mask!r} must be an int >= 0 of EventType bits, event type names such as "
                         f"'Coll|KernelCh', or None for no limit")
    if m >> 32:                         # 32 bits, as SLICETRACE_PROFILE_EVENT_MASK's (and ~KernelStep & 2**32-1)
        raise UsageError(f"mask={given!r} has bits {m >> 32 << 32:#x} beyond an event mask's 32 (0..2**32-1); "
                         f"the event types are {int(ALL_TYPES):#x} (GROUP 0x1 .. KERNEL_STEP 0x10000)")
    return m
