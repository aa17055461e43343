"""A send/recv group as the API runs it: a group of mixed dtypes moves bytes, its receives may not overlap other
parts, its layout (pieces, plan, connections moved on) is cached per shape and connection positions, and its tasks
are described to the plugins when one listens."""
from __future__ import annotations

from typing import Any

from .api_checks import check_group_overlap, check_self_types, ptr
from .backend.base import DTYPES, Work
from .errors import MismatchError
from .events.abi import DATATYPE_NAMES
from .events.host import TaskInfo
from .plan.groups import group_layout
from .plan.schedule import P2pPart

_PLANS_MAX = 256        # cached group layouts per communicator (a layout holds its plan)


def group_plan(comm: Any, entries: list, checked: bool) -> tuple[list, str, int, tuple]:
    """(entries as run: bytes when dtypes mix, dtype, itemsize, group_layout's result) for comm's group."""
    given, be = entries, comm._session.backend
    dt0 = entries[0][2]
    mixed = len(entries) > 1 and any(e[2] != dt0 for e in entries)
    if mixed:                               # NCCL allows it: the data path moves bytes, each message keeps its
        check_self_types(entries, comm._rank)                # own (count, dtype) to check
        entries = [(P2pPart(p.peer, p.is_send, p.count * b.itemsize, p.index, p.offset * b.itemsize),
                    be.byte_view(b), "uint8", ut) for p, b, _, ut in entries]
    dtype, itemsize = ("uint8", 1) if mixed else (entries[0][2], entries[0][1].itemsize)   # cuda: no byte view
    if len(entries) > 1 and not checked:
        check_group_overlap(entries, itemsize)
    pos = comm._p2p_pos
    shape = tuple((p.peer, p.is_send, p.count, p.offset) for p, _, _, _ in entries)
    start = tuple(pos.get((p.peer, p.is_send), 0) for p, _, _, _ in entries) if pos else ()
    key = (itemsize, shape, start, tuple((e[1].itemsize, DTYPES.index(e[2])) for e in given) if mixed else ())
    hit = comm._p2p_plans.get(key)
    if hit is None:
        if len(comm._p2p_plans) >= _PLANS_MAX:
            comm._p2p_plans.clear()
        s = comm._settings
        hit = comm._p2p_plans[key] = group_layout(*key, comm._rank, comm._world, be.channels_for, be.p2p_channels(),
                                                  s.p2p_chunk_bytes, s.step_bytes)
    return entries, dtype, itemsize, hit


def run_group(comm: Any, entries: list, checked: bool = False) -> None:
    """Run comm's send/recv entries as one group (inside its _guarded: one thread, on its device)."""
    given, be = entries, comm._session.backend
    entries, dtype, itemsize, (pieces, plan, nprog, moves, chans) = group_plan(comm, entries, checked)
    pos = comm._p2p_pos
    parts = [(part, entries[ei][1]) for part, ei in pieces]
    sess = comm._session                    # threshold on the group's largest message
    mask = sess.op_mask_for(max(p.count for p, _, _, _ in entries) * itemsize if sess.profiling else 0, True)
    tasks = []
    if mask:                                # events only when a plugin listens
        for (p, buf, dt, ut), n, ch in zip(given, nprog, chans):      # the caller's count and dtype
            at = ptr(buf) + p.offset * buf.itemsize
            tasks.append(TaskInfo(func="Send" if p.is_send else "Recv", peer=p.peer, is_send=p.is_send,
                                  count=p.count, datatype=DATATYPE_NAMES.get(dt, dt), root=0,
                                  send_buff=at if p.is_send else 0, recv_buff=0 if p.is_send else at,
                                  n_programs=n, channels=ch, user_tag=ut))
    comm._tag += 1
    info = comm._info("send_recv", tasks, entries[0][3], mask, comm._next_seq("send_recv"), comm._stream)
    sess.run(Work(comm._tag, plan, dtype, "sum", parts=parts, stream=comm._stream), info)
    if moves:                               # launched: the pair's next pieces start after these, at both ends
        nconn = be.p2p_channels()           # (a group refused before its launch moves nothing)
        for k, n in moves:
            pos[k] = (pos.get(k, 0) + n) % nconn


def a2a_mismatch(e: MismatchError, sends: list[int], recvs: list[int]) -> MismatchError:
    """A point-to-point mismatch inside all_to_all, said in its terms: which counts must agree, and this rank's."""
    return MismatchError(f"all_to_all: {e}; rank i's send_counts[j] must equal rank j's recv_counts[i] (this rank's "
                         f"send_counts={list(sends)}, recv_counts={list(recvs)})")
