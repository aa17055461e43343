"""Pure schedules: an operation -> channels -> primitive calls -> slices, with NCCL's Simple-protocol rules.

Every backend runs these plans. The CUDA kernels compute the same schedule on the device from
`ChannelProgram.params` and are checked against `expected_slices()` in the tests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

from ..config import NCCL_STEPS
from ..errors import UsageError
from .cache import plans_cache as _plans_cache

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
FUNCS = COLLECTIVES + ("send_recv",)
MIN_CHANNEL_BYTES = 32 * 1024          # NCCL's MinTrafficPerChannel cell
ALIGN_BYTES = 16


@dataclass(frozen=True)
class Proto:
    """Simple-protocol geometry for one function."""
    step_bytes: int        # buffsize / NCCL_STEPS
    slice_steps: int       # FIFO steps per slice (StepPerSlice)
    chunk_steps: int       # FIFO steps per chunk (SlicePerChunk * StepPerSlice)

    @property
    def slice_per_chunk(self) -> int:
        return self.chunk_steps // self.slice_steps


def proto_for(func: str, step_bytes: int) -> Proto:
    if func in ("all_reduce", "all_gather", "reduce_scatter"):
        return Proto(step_bytes, NCCL_STEPS // 4, NCCL_STEPS // 2)     # 2 / 4
    return Proto(step_bytes, 1, 1)


@dataclass(frozen=True)
class Prim:
    """One primitive call (NCCL prims: send, recvReduceSend, recvCopySend, ...).

    recv_from/send_to are communicator ranks (None = that direction is unused). The data of slice i is
    elements [src_off + s_off, +s_n) of `src` ('in' or 'out' buffer), combined with the received slice when
    `reduce`, then written to `dst` ('out') at dst_off + s_off and/or sent.
    """
    name: str
    recv_from: int | None
    send_to: int | None
    src: str | None        # 'in', 'out' or None (pure recv)
    dst: str | None        # 'out' or None (pure send)
    reduce: bool
    src_off: int
    dst_off: int
    nelem: int
    slices: tuple[tuple[int, int], ...]   # (offset within the prim, elements); may be 0 elements
    final: bool = False    # this write produces the final value (avg divides here)


@dataclass(frozen=True)
class ChannelProgram:
    channel: int
    kind: str              # 'ring' or 'p2p'
    prims: tuple[Prim, ...]
    params: dict           # the few numbers the CUDA kernel needs to rebuild this program


@dataclass(frozen=True)
class OpPlan:
    func: str
    nranks: int
    rank: int
    count: int             # NCCL semantics: AR/BC/RD elements; AG send count; RS recv count
    itemsize: int
    root: int
    proto: Proto
    programs: tuple[ChannelProgram, ...]
    self_pairs: tuple[tuple[int, int], ...] = ()   # p2p: (send, recv) part indices of copies to self
    algo: str = ""         # '': Simple ring / chain / p2p; else the symmetric kernel's name (plan/symmetric.py)

    @property
    def n_channels(self) -> int:
        return len({p.channel for p in self.programs})

    @cached_property
    def unique_ch_keys(self) -> bool:
        """No two programs on one channel stamp the same KernelCh key (peer, direction): p2p parts to one peer in
        one direction may share a channel (the drain's after-lap pairing needs to know). Once per cached plan."""
        keys = [(p.channel,) + ((p.params["peer"], p.params["is_send"]) if p.kind == "p2p" else ())
                for p in self.programs]
        return len(set(keys)) == len(keys)


def div_up(a: int, b: int) -> int:
    return -(-a // b)


def align_up(a: int, b: int) -> int:
    return div_up(a, b) * b


def split_channels(count: int, itemsize: int, nchannels: int, traffic: int = 1) -> list[tuple[int, int]]:
    """Contiguous (lo, n) element ranges, 16-byte aligned, each carrying at least 32 KiB of traffic (traffic:
    bytes moved per byte of count, nranks for all_gather / reduce_scatter as NCCL counts them); empty for count 0."""
    if count == 0:
        return []
    nbytes = count * itemsize
    use = max(1, min(nchannels, nbytes * traffic // MIN_CHANNEL_BYTES))
    align = max(1, ALIGN_BYTES // itemsize)
    per = align_up(div_up(count, use), align)
    out, lo = [], 0
    while lo < count:
        n = min(per, count - lo)
        out.append((lo, n))
        lo += n
    return out


def slice_layout(nelem: int, itemsize: int, proto: Proto) -> tuple[tuple[int, int], ...]:
    """NCCL genericOp: sliceSize = max(ceil(n/(16*SPC))*16, stepSize*StepPerSlice/32) elements; always SPC slices."""
    spc = proto.slice_per_chunk
    step_elems = proto.step_bytes // itemsize
    size = max(div_up(nelem, 16 * spc) * 16, step_elems * proto.slice_steps // 32)
    size = min(size, step_elems * proto.slice_steps)
    out, off = [], 0
    for _ in range(spc):
        n = max(0, min(size, nelem - off))
        out.append((off, n))
        off += n
    return tuple(out)


def _prim(name, rf, st, src, dst, red, so, do, n, it, proto, final=False) -> Prim:
    return Prim(name, rf, st, src, dst, red, so, do, n, slice_layout(n, it, proto), final)


def _ring_allreduce(rank, n, lo, cnt, it, proto):
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    chunk = proto.step_bytes * proto.chunk_steps // it
    loop = n * chunk
    prims = []
    for eoff in range(0, cnt, loop):
        rem = cnt - eoff
        cc = chunk if rem >= loop else align_up(div_up(rem, n), max(1, ALIGN_BYTES // it))

        def at(c):
            o = eoff + c * cc
            return lo + o, max(0, min(cc, cnt - o))
        ur = lambda i: (rank + i) % n      # ring.userRanks[i]
        o, m = at(ur(n - 1))
        prims.append(_prim("send", None, nxt, "in", None, False, o, o, m, it, proto))
        for j in range(2, n):
            o, m = at(ur(n - j))
            prims.append(_prim("recvReduceSend", prv, nxt, "in", None, True, o, o, m, it, proto))
        o, m = at(ur(0))
        prims.append(_prim("recvReduceCopySend", prv, nxt if n > 1 else None, "in", "out", True, o, o, m, it,
                           proto, final=True))
        for j in range(1, n - 1):
            o, m = at(ur(n - j))
            prims.append(_prim("recvCopySend", prv, nxt, None, "out", False, o, o, m, it, proto))
        o, m = at(ur(1))
        prims.append(_prim("recv", prv, None, None, "out", False, o, o, m, it, proto))
    return prims, {"chunk_elems": chunk}


def _ring_allgather(rank, n, lo, cnt, count, it, proto):
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    chunk = proto.step_bytes * proto.chunk_steps // it
    prims = []
    for eoff in range(0, cnt, chunk):
        m = min(chunk, cnt - eoff)
        off = lo + eoff
        prims.append(_prim("copySend", None, nxt, "in", "out", False, off, rank * count + off, m, it, proto))
        for j in range(1, n - 1):
            src_rank = (rank - j) % n
            d = src_rank * count + off
            prims.append(_prim("recvCopySend", prv, nxt, None, "out", False, d, d, m, it, proto))
        d = ((rank + 1) % n) * count + off
        prims.append(_prim("recv", prv, None, None, "out", False, d, d, m, it, proto))
    return prims, {"chunk_elems": chunk}


def _ring_reducescatter(rank, n, lo, cnt, count, it, proto):
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    chunk = proto.step_bytes * proto.chunk_steps // it
    prims = []
    for eoff in range(0, cnt, chunk):
        m = min(chunk, cnt - eoff)
        off = lo + eoff
        s = ((rank - 1) % n) * count + off
        prims.append(_prim("send", None, nxt, "in", None, False, s, s, m, it, proto))
        for j in range(2, n):
            s = ((rank - j) % n) * count + off
            prims.append(_prim("recvReduceSend", prv, nxt, "in", None, True, s, s, m, it, proto))
        prims.append(_prim("recvReduceCopy", prv, None, "in", "out", True, rank * count + off, off, m, it, proto,
                           final=True))
    return prims, {"chunk_elems": chunk}


def _chain(rank, n, root, lo, cnt, it, proto, reduce_: bool):
    """Broadcast flows root -> root+1 -> ... ; reduce flows root+1 -> ... -> root."""
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    chunk = proto.step_bytes * proto.chunk_steps // it
    pos = (rank - root) % n               # 0 = root
    prims = []
    for eoff in range(0, cnt, chunk):
        m = min(chunk, cnt - eoff)
        o = lo + eoff
        if not reduce_:
            if pos == 0:
                prims.append(_prim("copySend", None, nxt, "in", "out", False, o, o, m, it, proto))
            elif pos == n - 1:
                prims.append(_prim("recv", prv, None, None, "out", False, o, o, m, it, proto))
            else:
                prims.append(_prim("recvCopySend", prv, nxt, None, "out", False, o, o, m, it, proto))
        else:
            if pos == 1:
                prims.append(_prim("send", None, nxt, "in", None, False, o, o, m, it, proto))
            elif pos == 0:
                prims.append(_prim("recvReduceCopy", prv, None, "in", "out", True, o, o, m, it, proto, final=True))
            else:
                prims.append(_prim("recvReduceSend", prv, nxt, "in", None, True, o, o, m, it, proto))
    return prims, {"chunk_elems": chunk}


@_plans_cache(lambda func, nranks, rank, count, itemsize, *rest: count * itemsize)
def plan_collective(func: str, nranks: int, rank: int, count: int, itemsize: int, root: int,
                    nchannels: int, step_bytes: int) -> OpPlan:
    if func not in COLLECTIVES:
        raise UsageError(f"func={func!r} is not one of {COLLECTIVES}")
    if not 0 <= rank < nranks:
        raise UsageError(f"rank={rank} must be in 0..{nranks - 1}")
    if not 0 <= root < nranks:
        raise UsageError(f"root={root} must be in 0..{nranks - 1}")
    proto = proto_for(func, step_bytes)
    programs = []
    if nranks > 1:
        traffic = nranks if func in ("all_gather", "reduce_scatter") else 1
        for ch, (lo, cnt) in enumerate(split_channels(count, itemsize, nchannels, traffic)):
            if func == "all_reduce":
                prims, extra = _ring_allreduce(rank, nranks, lo, cnt, itemsize, proto)
            elif func == "all_gather":
                prims, extra = _ring_allgather(rank, nranks, lo, cnt, count, itemsize, proto)
            elif func == "reduce_scatter":
                prims, extra = _ring_reducescatter(rank, nranks, lo, cnt, count, itemsize, proto)
            else:
                prims, extra = _chain(rank, nranks, root, lo, cnt, itemsize, proto, func == "reduce")
            programs.append(ChannelProgram(ch, "ring", tuple(prims), {"lo": lo, "count": cnt, **extra}))
    return OpPlan(func, nranks, rank, count, itemsize, root, proto, tuple(programs))


@dataclass(frozen=True)
class P2pPart:
    peer: int
    is_send: bool
    count: int             # elements
    index: int             # position in the group (buffers are matched by it)
    offset: int = 0        # first element in its buffer (a large send/recv split over channels: one buffer)
    total: int = -1        # elements of the whole send/recv it is a piece of (-1: itself), checked at both ends
    hdr: tuple = ()        # a group of mixed dtypes moves bytes: the caller's (count, dtype code, total) to check


MAX_P2P_PROGRAMS = 64         # programs of one send/recv group per rank (the cuda backend's MAXP)


def p2p_pieces(nbytes: int, channels: int, nranks: int) -> int:
    """Programs for one send or recv: large ones spread over several channels (NCCL's p2p channels per peer),
    one per 512 KiB up to 32 (H200 pair, 64 MiB-1 GiB: 32 beat 16 by 7-17 %). `channels` is the backend's channel
    count for nbytes. Both ends must cut a message alike whatever else each groups with it (NCCL does not ask the
    two sides to group alike), so this depends on the message and the world size alone; the budget lets an
    exchange (a send and a receive) with every peer fit MAX_P2P_PROGRAMS, as NCCL's channels per peer follow the
    rank count. A group of more large messages per peer can need more programs (cuda refuses it, naming the limit)."""
    budget = MAX_P2P_PROGRAMS // _p2p_layout(nranks)[2]       # 2 connections per peer fill 2 * width channels
    return max(1, min(32, channels // 2, nbytes >> 19, budget))


def split_p2p(shape: tuple, rank: int, nranks: int, itemsize: int, channels_for) -> tuple[list, list[int]]:
    """A group's (peer, is_send, count, offset) entries -> (pieces as (P2pPart, entry index), programs per entry).
    Pieces are 16-byte aligned offsets into the entry's buffer; an entry to self stays whole (a copy)."""
    pieces: list = []
    nprog: list[int] = []
    for ei, (peer, is_send, count, base) in enumerate(shape):
        nbytes = count * itemsize
        k = 1 if peer == rank else p2p_pieces(nbytes, channels_for(nbytes), nranks)
        per = count if k == 1 else align_up(div_up(count, k), max(1, ALIGN_BYTES // itemsize))
        los = range(0, count, per) if count else (0,)
        for lo in los:
            pieces.append((P2pPart(peer, is_send, min(per, count - lo), len(pieces), base + lo, count), ei))
        nprog.append(0 if peer == rank else len(los))
    return pieces, nprog


def p2p_channel(src: int, dst: int, conn: int, nranks: int, nchannels: int) -> int:
    """The channel of the connection src -> dst numbered `conn` (a send/recv split in pieces uses connections
    0, 1, ... to one peer). Both ranks compute the same channel from the pair, so a send and the receive that takes
    its data run on one channel, as in NCCL, and (channel, step) names the connection in a trace. Spread by the ring
    distance d as NCCL does, with a colour per connection so that a rank's send to r + d and its receive from r - d
    never share a channel (a block on the GPU): sources one d-step apart get different colours, 2 of them where
    the cycle of d-steps has even length, 3 where it is odd (3 ranks, or d = 2 of 6), which 2 cannot colour."""
    base, color, width = _p2p_layout(nranks)
    d = (dst - src) % nranks
    return (conn * width + base[d] + color[d][src]) % max(1, nchannels)


@lru_cache(maxsize=256)
def _p2p_layout(nranks: int) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...], int]:
    """Per distance d: its first channel (base), each source rank's colour, and the channels of one connection
    number across all distances (width). The d-steps split the ranks into gcd(n, d) cycles, all n / gcd long; a
    source's colour is its position in its cycle, mod 2."""
    n = max(1, nranks)
    base, color, width = [0] * n, [(0,) * n], 0
    for d in range(1, n):
        cycle = n // math.gcd(n, d)
        col = [0] * n
        for start in range(n // cycle):
            for i in range(cycle):               # odd cycle: its last source would clash with its first
                col[(start + i * d) % n] = 2 if cycle % 2 and i == cycle - 1 else i % 2
        base[d] = width
        width += 3 if cycle % 2 else 2
        color.append(tuple(col))
    return tuple(base), tuple(color), max(1, width)


def plan_p2p(parts, nranks: int, rank: int, itemsize: int, chunk_bytes: int,
             step_bytes: int, nchannels: int = 1) -> OpPlan:
    return _plan_p2p(tuple(parts), nranks, rank, itemsize, chunk_bytes, step_bytes, nchannels)


@_plans_cache(lambda parts, nranks, rank, itemsize, *rest: sum(p.count for p in parts) * itemsize)
def _plan_p2p(parts: tuple[P2pPart, ...], nranks: int, rank: int, itemsize: int, chunk_bytes: int,
              step_bytes: int, nchannels: int) -> OpPlan:
    """A group of sends/recvs. Each part is its own program on its peer connection; they run concurrently.

    Parts to self are copies done by the backend without a connection (NCCL's self copy) and get no program.
    """
    proto = Proto(step_bytes, 1, 1)
    chunk = chunk_bytes // itemsize
    programs = []
    conns: dict[tuple[int, bool], int] = {}       # (peer, is_send) -> parts so far: the next one's connection
    for part in parts:
        if not 0 <= part.peer < nranks:
            raise UsageError(f"peer={part.peer} must be in 0..{nranks - 1}")
        if part.peer == rank:
            continue
        k = conns.get((part.peer, part.is_send), 0)
        conns[(part.peer, part.is_send)] = k + 1
        src, dst = (rank, part.peer) if part.is_send else (part.peer, rank)
        prims = []
        for off in range(0, part.count, chunk):
            m = min(chunk, part.count - off)
            if part.is_send:
                prims.append(Prim("send", None, part.peer, "in", None, False, off, off, m, ((0, m),)))
            else:
                prims.append(Prim("recv", part.peer, None, None, "out", False, off, off, m, ((0, m),)))
        programs.append(ChannelProgram(p2p_channel(src, dst, k, nranks, nchannels), "p2p", tuple(prims),
                                       {"part": part.index, "peer": part.peer, "is_send": part.is_send,
                                        "count": part.count, "chunk_elems": chunk, "conn": k,
                                        "total": part.count if part.total < 0 else part.total, "hdr": part.hdr}))
    return OpPlan("send_recv", nranks, rank, sum(p.count for p in parts), itemsize, 0, proto, tuple(programs),
                  self_pairs(parts, rank))


def rotate_p2p(plan: OpPlan, start: dict, nconn: int, nchannels: int) -> OpPlan:
    """The group's plan with the connections to each (peer, is_send) moved on by start[(peer, is_send)], the pieces
    that went to (came from) that peer before this group. Both ends count a pair's pieces alike however each one
    groups its messages (two sends in one group against two single receives), so the n-th piece of a pair runs on
    one connection and channel at both ends. The plan alone numbers them from 0 in each group, which differs."""
    if not any(start.values()):
        return plan
    progs = []
    for q in plan.programs:
        pr = q.params
        s = start.get((pr["peer"], pr["is_send"]), 0)
        if not s:
            progs.append(q)
            continue
        k = (pr["conn"] + s) % nconn
        src, dst = (plan.rank, pr["peer"]) if pr["is_send"] else (pr["peer"], plan.rank)
        progs.append(ChannelProgram(p2p_channel(src, dst, k, plan.nranks, nchannels), q.kind, q.prims,
                                    {**pr, "conn": k}))
    return OpPlan(plan.func, plan.nranks, plan.rank, plan.count, plan.itemsize, plan.root, plan.proto, tuple(progs),
                  plan.self_pairs)


def self_pairs(parts, rank: int) -> tuple[tuple[int, int], ...]:
    """(send index, recv index) into `parts` for a group's sends to self, matched in order with its receives from
    self (NCCL's self copy). Checked here, before anything runs, so both backends reject the same groups."""
    sends = [i for i, p in enumerate(parts) if p.peer == rank and p.is_send]
    recvs = [i for i, p in enumerate(parts) if p.peer == rank and not p.is_send]
    if len(sends) != len(recvs):
        raise UsageError(f"a send/recv group on rank {rank} has {len(sends)} send(s) to itself and {len(recvs)} "
                         f"recv(s) from itself; they pair up in order, so the numbers must be equal")
    for k, (i, j) in enumerate(zip(sends, recvs)):
        if parts[i].count != parts[j].count:
            raise UsageError(f"send to self #{k} on rank {rank} has count={parts[i].count} but the recv from self "
                             f"it pairs with has count={parts[j].count}; paired counts must be equal")
    return tuple(zip(sends, recvs))
