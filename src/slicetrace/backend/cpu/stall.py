"""Point-to-point deadlock: ranks whose p2p ops wait on each other in a cycle none of them can break (rank 0
receives from rank 1 while rank 1 receives from rank 0; both send more than a FIFO holds to each other).

A p2p progress loop that has waited a check period (transport.CHECK_EVERY_S) publishes its stall in its control
block (shm.C_STALL): a new epoch, its active lanes (peer, direction, message), then a tick at each pause (a pass
that moved nothing). A lane waits on a word only its peer writes, and only from its lane of the other direction
toward us (a receive on the sender's tail or header, a send on the receiver's head or header checks). So when
rank a stalls on a lane toward b and b's stall has no active lane of the other direction toward a (its op has
none, or that one has ended), b writes that word only after its op ends, and a's op ends after b's; around a cycle
of such waits none can end.

Judged at two checks of a wait: each rank of the cycle kept its epoch and ticked twice after the first check's
last read (the second tick's pass began after it), so it was inside that stall when the first check ended and
then failed a whole pass. A slow peer, one busy in another op or between ops, never ticks in the stall we saw;
one whose op still has the lane we wait on is no edge. A wait shorter than a check period pays nothing.
"""
from __future__ import annotations

from ..base import DTYPES
from .shm import (ABORT_MISMATCH, C_STALL, NSIG, STALL_EPOCH, STALL_LANE0, STALL_LANES, STALL_LAST, STALL_MANY,
                  STALL_NLANES, STALL_TICK)
from .transport import Backoff, Guard

_E, _T, _N, _LAST, _W0 = (C_STALL + i for i in (STALL_EPOCH, STALL_TICK, STALL_NLANES, STALL_LAST, STALL_LANE0))
_TOTAL = (1 << 56) - 1
_SIZES = {"int8": 1, "uint8": 1, "int32": 4, "int64": 8, "float16": 2, "float32": 4, "float64": 8, "bfloat16": 2}

Lane = tuple[int, int, int, int, int]       # peer, is_send, held, the message's total count, dtype code


def lane_words(peer: int, is_send: bool, held: bool, total: int, dcode: int) -> tuple[int, int]:
    return peer | is_send << 32 | held << 33, min(total, _TOTAL) | dcode << 56


def publish(ctl, lanes: list) -> None:
    """A new stall (lanes: lane_words each). Its epoch is written last, 0 before: a reader that sees one epoch
    before and after its reads has a whole record."""
    e = ctl[_LAST] + 1
    ctl[_LAST] = e
    ctl[_E] = 0
    if len(lanes) > STALL_LANES:         # not listed: a rank with this many lanes is never judged
        ctl[_N] = STALL_MANY
    else:
        for i, (w0, w1) in enumerate(lanes):
            ctl[_W0 + 2 * i], ctl[_W0 + 2 * i + 1] = w0, w1
        ctl[_N] = len(lanes)
    ctl[_E] = e


def read(ctl) -> tuple[int, int, tuple[Lane, ...]] | None:
    """(epoch, tick, lanes) of a whole record, else None. The tick is read inside the epoch's reads: a later
    stall publishes its epoch before its first tick."""
    e, n = ctl[_E], ctl[_N]
    if not e or n > STALL_LANES:
        return None
    words = ctl[_W0:_W0 + 2 * n].tolist()
    tick = ctl[_T]
    if ctl[_E] != e:
        return None
    return e, tick, tuple((w0 & 0xFFFFFFFF, w0 >> 32 & 1, w0 >> 33 & 1, w1 & _TOTAL, w1 >> 56)
                          for w0, w1 in zip(words[::2], words[1::2]))


def _edges(live: dict, a: int):
    """(b, lane) for a's lanes toward a rank b whose stall has no lane of the other direction toward a."""
    for ln in live[a]:
        b = ln[0]
        if b != a and b in live and not any(m[0] == a and m[1] != ln[1] for m in live[b]):
            yield b, ln


def find_cycle(rank: int, live: dict) -> list | None:
    """[(rank, lane toward the next one), ...] around a cycle of such waits through `rank` (live: rank -> lanes of
    the ranks judged stalled), else None."""
    if rank not in live:
        return None
    nodes, its, path, done = [rank], [_edges(live, rank)], [], {rank}
    while its:
        step = next(its[-1], None)
        if step is None:                 # explored: no way back to `rank` through it
            its.pop()
            nodes.pop()
            if path:
                path.pop()
            continue
        b, ln = step
        if b == rank:
            return path + [(nodes[-1], ln)]
        if b not in done:
            done.add(b)
            path.append((nodes[-1], ln))
            nodes.append(b)
            its.append(_edges(live, b))
    return None


def _waits(rank: int, lane: Lane) -> str:
    peer, send, held, total, dcode = lane
    dt = DTYPES[dcode] if dcode < len(DTYPES) else f"dtype code {dcode}"
    what = f"{total} x {dt}" + (f" ({total * _SIZES[dt]} B)" if dt in _SIZES else "")
    if send:
        return (f"rank {rank} waits to send {what} to rank {peer}"
                + (f" (behind {NSIG} messages rank {peer} has not received)" if held else ""))
    return f"rank {rank} waits to receive {what} from rank {peer}"


def deadlock_text(cycle: list) -> str:
    """The cycle from its lowest rank, so that every rank that finds it words it alike."""
    k = min(range(len(cycle)), key=lambda i: cycle[i][0])
    said = [_waits(r, ln) for r, ln in cycle[k:] + cycle[:k]]
    waits = said[0] + " while " + said[1] if len(said) == 2 else ", ".join(said[:-1]) + " and " + said[-1]
    return (f"point-to-point deadlock: {waits}: the ranks' sends and receives do not match (each waits on a rank "
            f"whose current operation has no matching send or receive, so none of them can end)")


class StallBackoff(Backoff):
    """The p2p progress loop's idle stretch (what: p2p._Blocked). At its first check (CHECK_EVERY_S into the
    wait) it publishes the stall and becomes a _Ticking one; at each later check it raises MismatchError for a
    cycle of waits through this rank that two checks agree on."""

    __slots__ = ("seen",)

    def __init__(self, guard: Guard, what, peers: tuple[int, ...]):
        super().__init__(guard, what, peers, p2p=True)
        self.seen: dict[int, tuple[int, int]] = {}      # rank -> (epoch, tick) read at the end of the last check

    def check_order(self) -> None:
        Backoff.check_order(self)
        if type(self) is StallBackoff:
            publish(self.g.ctl, self.what.stall())      # the lanes stay as they are while nothing moves
            self.__class__ = _Ticking   # no tick before (it would count for our last stall's record), and a
            return                      # shorter wait's pauses cost what any wait's do
        cycle = self.cycle()
        if cycle is not None:
            raise self.g.fail(ABORT_MISMATCH, deadlock_text(cycle))

    def cycle(self) -> list | None:
        g = self.g
        ctls = {p: v[0] for p, v in g.peers.items()}
        ctls[g.rank] = g.ctl
        recs: dict = {}
        todo = [g.rank]
        while todo:                     # the stalls our lanes lead to, and theirs
            p = todo.pop()
            if p in recs or p not in ctls:
                continue
            recs[p] = r = read(ctls[p])
            if r is not None:
                todo += [ln[0] for ln in r[2]]
        seen = self.seen                # each tick of the next check's must come after every read of this one
        self.seen = {p: (r[0], ctls[p][_T]) for p, r in recs.items() if r is not None}
        live = {p: r[2] for p, r in recs.items()
                if r is not None and p in seen and seen[p][0] == r[0] and r[1] >= seen[p][1] + 2}
        return find_cycle(g.rank, live)


class _Ticking(StallBackoff):
    __slots__ = ()

    def pause(self) -> None:
        self.g.ctl[_T] += 1             # the pass before this pause moved nothing
        Backoff.pause(self)
