"""A send/recv group's plan as the API runs it: a group of mixed dtypes moves bytes, its receives may not overlap
other parts, and its layout (pieces, plan, connections moved on) is cached per shape and connection positions."""
from __future__ import annotations

from typing import Any

from .api_checks import check_group_overlap, check_self_types
from .backend.base import DTYPES
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
