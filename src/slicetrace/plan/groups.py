"""A send/recv group's layout: its pieces, its plan with the pair's connections moved on, what it moves."""
from __future__ import annotations

import dataclasses
from typing import Callable

from .schedule import OpPlan, plan_p2p, rotate_p2p, split_p2p


def group_layout(itemsize: int, shape: tuple, start: tuple, caller: tuple, rank: int, world: int,
                 channels_for: Callable[[int], int], nconn: int, chunk_bytes: int, step_bytes: int) -> tuple:
    """(pieces as (part, entry index), plan, programs per entry, pieces per (peer, is_send), channels per entry)
    for a group's (peer, is_send, count, offset) tuples, its connections moved on by `start` (per entry;
    rotate_p2p) over `nconn` p2p channels. Pieces carry offsets, never views (callers cache this). caller: a group
    of mixed dtypes in bytes, each entry's (itemsize, dtype code): the headers its pieces carry, as a peer that does
    not mix would cut them (16-byte aligned pieces fall on elements: the same pieces)."""
    pieces, nprog = split_p2p(shape, rank, world, itemsize, channels_for)
    if caller:
        pieces = [(dataclasses.replace(p, hdr=(p.count // caller[ei][0], caller[ei][1], p.total // caller[ei][0])),
                   ei) for p, ei in pieces]
    plan: OpPlan = plan_p2p([p for p, _ in pieces], world, rank, itemsize, chunk_bytes, step_bytes, nconn)
    if start:
        plan = rotate_p2p(plan, {(e[0], e[1]): s for e, s in zip(shape, start)}, nconn, nconn)
    moves: dict[tuple[int, bool], int] = {}
    chans: list[set[int]] = [set() for _ in shape]          # per entry: where its records are stamped
    for prog in plan.programs:
        k = (prog.params["peer"], prog.params["is_send"])
        moves[k] = moves.get(k, 0) + 1
        chans[pieces[prog.params["part"]][1]].add(prog.channel)
    return pieces, plan, nprog, tuple(moves.items()) if nconn > 1 else (), [tuple(sorted(c)) for c in chans]
