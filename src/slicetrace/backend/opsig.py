"""Collective signatures: what each rank says its n-th collective is (function, count, dtype, reduction, root,
channels), so ranks that disagree raise MismatchError instead of mixing data.

The cpu backend keeps its table in each rank's control block; the cuda backend, whose launches are asynchronous,
keeps one `SigTable` per communicator in a small shared-memory segment: each rank writes its row at submit, and
reads the others' when it waits, from its watchdog and when an op failed.
"""
from __future__ import annotations

import secrets

from ..events.abi import FUNC_NAMES
from ..plan.schedule import COLLECTIVES
from ..rendezvous import Store
from .base import DTYPES, REDOPS
from .segment import Segment

NSIG = 16            # entries kept per rank: a peer more than NSIG collectives ahead is not compared
_W = 4               # words per entry: seq, count, packed, cfg

Sig = tuple[int, int, int, int]       # (seq, count, packed, cfg)


def encode_sig(func: str, count: int, dtype: str, redop: str, root: int, nch: int, step_bytes: int,
               sym: bool = False):
    reduces = func in ("all_reduce", "reduce_scatter", "reduce")
    packed = (COLLECTIVES.index(func) | DTYPES.index(dtype) << 8
              | (REDOPS.index(redop) if reduces else 0xFF) << 16
              | (root if func in ("broadcast", "reduce") else 0) << 24 | sym << 32)
    return count, packed, nch | step_bytes << 8


def describe_sig(count: int, packed: int, cfg: int) -> str:
    func, dt = COLLECTIVES[packed & 0xFF], DTYPES[packed >> 8 & 0xFF]
    red, root = packed >> 16 & 0xFF, packed >> 24 & 0xFF
    s = f"{func}(count={count}, dtype={dt}"
    s += "" if red == 0xFF else f", op={REDOPS[red]}"
    s += f", root={root})" if func in ("broadcast", "reduce") else ")"
    sym = ", symmetric kernel: buffers in windows, mem_alloc(symmetric=True)" if packed >> 32 & 1 else ""
    return s + f" [nchannels={cfg & 0xFF}, step_bytes={cfg >> 8}{sym}]"


def coll_name(sig: Sig, seq_number: int) -> str:
    """Collective `sig` as errors name it: as its trace does (NCCL's function name and SeqNum: numbered per
    function from 0), then by sig's own number (the communicator's collectives from 1, what the ranks compare);
    seq_number < 0 (not known: a Work built without one): that number alone."""
    if seq_number < 0:
        return f"collective #{sig[0]}"
    return f"{FUNC_NAMES[COLLECTIVES[sig[2] & 0xFF]]} #{seq_number} (collective #{sig[0]} of this communicator)"


def differ_text(seq: int, rank: int, mine: tuple, peer: int, theirs: tuple) -> str:
    return (f"collective #{seq} differs across ranks: rank {rank} runs {describe_sig(*mine)}, "
            f"rank {peer} runs {describe_sig(*theirs)}")


def order_text(seq: int, peer: int, theirs: tuple, rank: int, mine: str) -> str:
    """A peer runs collective #seq where this rank runs point-to-point first (`mine`: what it does toward peer)."""
    return (f"collective #{seq} differs across ranks: rank {peer} runs {describe_sig(*theirs)}, rank {rank} runs "
            f"{mine} first (point-to-point: the ranks called their ops in different orders)")


class SigTable:
    """world rows x NSIG entries x (seq, count, packed, cfg) u64 words in one segment. An entry is written as a
    seqlock (seq 0, the words, then seq), so a reader that sees the same seq before and after has a whole entry."""

    def __init__(self, seg: Segment, rank: int, world: int):
        self.seg, self.rank, self.world = seg, rank, world
        self.nbytes = world * NSIG * _W * 8         # the table; the segment's `extra` bytes follow it
        self.mv = seg.words(0, self.nbytes)
        self._peers = tuple(p for p in range(world) if p != rank)
        self.seq = 0                                # collectives numbered so far
        self._enc: dict[tuple, tuple] = {}          # (id(plan), dtype, redop) -> (plan, encoded)

    @classmethod
    def open(cls, store: Store, prefix: str, job: str, rank: int, world: int, timeout_s: float,
             extra: int = 0) -> "SigTable":
        """Rank 0 creates the segment (`extra` more bytes after the table) and names it in the store; the others
        attach. Call `attached` once every rank has (after a barrier): the name is then unlinked, so nothing stays
        in /dev/shm."""
        size = max(4096, world * NSIG * _W * 8 + extra)
        if rank == 0:
            seg = Segment(f"st_{job}_sig_{secrets.token_hex(4)}", size, create=True)
            try:
                store.set(f"{prefix}/sigseg", seg.name.encode())
            except BaseException:
                seg.unlink()
                seg.close()
                raise
        else:
            name = store.get(f"{prefix}/sigseg", timeout_s, what="rank 0's collective-signature table").decode()
            seg = Segment(name)
        return cls(seg, rank, world)

    def attached(self) -> None:
        self.seg.unlink()         # by any rank: after a failed set-up rank 0 may be gone (a missing name is fine)

    def number(self, plan, dtype: str, redop: str, step_bytes: int) -> Sig:
        """Number the next collective and publish what it is."""
        key = (id(plan), dtype, redop)
        hit = self._enc.get(key)
        if hit is None or hit[0] is not plan:
            if len(self._enc) > 256:
                self._enc.clear()
            hit = self._enc[key] = (plan, encode_sig(plan.func, plan.count, dtype, redop, plan.root,
                                                     len(plan.programs), step_bytes))
        self.seq += 1
        sig = (self.seq,) + hit[1]
        self.publish(sig)
        return sig

    def publish(self, sig: Sig) -> None:
        seq, count, packed, cfg = sig
        mv, b = self.mv, (self.rank * NSIG + seq % NSIG) * _W
        mv[b] = 0
        mv[b + 1], mv[b + 2], mv[b + 3] = count, packed, cfg
        mv[b] = seq

    def entry(self, rank: int, seq: int) -> tuple | None:
        """Rank `rank`'s (count, packed, cfg) for collective #seq, if it has published it and the entry is kept."""
        mv, b = self.mv, (rank * NSIG + seq % NSIG) * _W
        if mv[b] != seq:
            return None
        words = (mv[b + 1], mv[b + 2], mv[b + 3])
        return words if mv[b] == seq else None

    def differs(self, sig: Sig | None) -> str | None:
        """Why collective `sig` is not what a peer that has published the same seq runs, else None."""
        if sig is None:
            return None
        seq, mine = sig[0], sig[1:]
        for p in self._peers:
            theirs = self.entry(p, seq)
            if theirs is not None and theirs != mine:
                return differ_text(seq, self.rank, mine, p, theirs)
        return None

    def first_difference(self) -> str | None:
        """The oldest of this rank's kept collectives that a peer runs differently, else None."""
        mv, r = self.mv, self.rank
        own = []
        for i in range(NSIG):
            b = (r * NSIG + i) * _W
            s = mv[b]
            entry = (s, mv[b + 1], mv[b + 2], mv[b + 3])
            if s and mv[b] == s:          # not one being rewritten by the submitting thread
                own.append(entry)
        for sig in sorted(own):
            why = self.differs(sig)
            if why is not None:
                return why
        return None

    def close(self) -> None:
        self.attached()
        self.seg.close()
