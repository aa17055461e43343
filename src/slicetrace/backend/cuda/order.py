"""Point-to-point against collectives across ranks (cuda): ranks that issue a send/recv and a collective in
different orders (rank 0 runs all_reduce then sends to rank 1, rank 1 receives from rank 0 then runs all_reduce)
raise MismatchError on both, not CommTimeoutError at timeout_s.

Each rank publishes, after its collective signatures (opsig.SigTable: same segment), how many non-empty messages
it has issued to and from each peer (live counts), a copy of them taken as it numbers each collective (an entry,
seqlock-written like the signatures) and its last few messages' sizes (for the error's text). The rule reads
counts, never time. Rank b issues a message before its collective #s, its peer a the other end after its #s, and
a's #s cannot end before b starts #s (a's output holds b's data): kernels run in issue order, so neither goes on.
b's receive waits for a send that a runs after #s; b's send waits for that receive when one of its pieces needs
more FIFO steps than a connection holds (a smaller one completes alone). Both ranks read the same counts and say
the same thing. A program that can finish never meets the rule (each case is a cycle of waits): nothing runs on
the GPU for it, and a slow peer is never judged."""
from __future__ import annotations

from ...config import NCCL_STEPS
from ...plan.schedule import COLLECTIVES
from ..base import DTYPES, Work
from ..opsig import NSIG, SigTable, order_text

_K = 4                  # message sizes kept per peer and direction (the error names the message; else its peer)
_ALL = ("all_reduce", "all_gather", "reduce_scatter")


def row_words(world: int) -> int:
    """u64 words of one rank's row: numbered, live (sent, got, big) per peer, NSIG entries, message sizes."""
    return 1 + 3 * world + NSIG * (1 + 3 * world) + 4 * _K * world


def needs(words: tuple, after: int, before: int) -> bool:
    """Whether collective `words` (count, packed, cfg) cannot end on rank `after` before rank `before` starts it:
    its output holds that rank's data. A root that only sends may end alone (a broadcast that fits the FIFO)."""
    count, packed, _ = words
    func, root = COLLECTIVES[packed & 0xFF], packed >> 24
    return count > 0 and (func in _ALL or (func == "broadcast" and root == before)
                          or (func == "reduce" and root == after))


class P2pOrder:
    """One rank's view of every rank's rows. The submitting thread writes this rank's (`count`, `numbered`); any
    thread reads (`find`). Live counts only grow, so one read early is a lower bound."""

    def __init__(self, sigs: SigTable, rank: int, world: int):
        self.sigs, self.rank, self.world = sigs, rank, world
        self.esz = 1 + 3 * world                            # an entry: its seq, then (sent, got, big) per peer
        self.ent = 1 + 3 * world                            # row offsets: numbered 0, live 1, entries, sizes
        self.msg = self.ent + NSIG * self.esz
        self.row = row_words(world)
        self.mv = sigs.seg.words(sigs.nbytes, self.nbytes(world))
        self._peers = tuple(p for p in range(world) if p != rank)
        self._sent = False                                  # a message counted: entries copy the counts

    @staticmethod
    def nbytes(world: int) -> int:
        return world * row_words(world) * 8

    # ---- this rank's writes (the submitting thread) ----
    def count(self, work: Work) -> None:
        """A launched send/recv group: its non-empty messages (the pieces of one follow each other, as in the
        ledger) and, per peer, the last send with a piece longer than the FIFO (`big`: 1 + its index)."""
        mv, rank, plan = self.mv, self.rank, work.plan
        live = rank * self.row + 1
        msg = rank * self.row + self.msg
        long = NCCL_STEPS * plan.programs[0].params["chunk_elems"] if plan.programs else 0
        code = DTYPES.index(work.dtype)
        left: dict[tuple[int, bool], int] = {}
        for part, _ in work.parts:
            q = part.peer
            if q == rank:
                continue
            n, c, whole = part.hdr or (part.count, code, part.count if part.total < 0 else part.total)
            if n != whole:                                  # a piece: the first one counts the message
                key = (q, part.is_send)
                rest = left.get(key, 0)
                left[key] = (rest or whole) - n
                if rest:
                    if long and part.is_send and part.count > long:
                        mv[live + 3 * q + 2] = mv[live + 3 * q]
                    continue
            elif not whole:
                continue                                    # nothing waits on an empty one (no step moves)
            d = 0 if part.is_send else 1
            at = live + 3 * q + d                           # sent (d 0) or got (d 1) toward q
            i = mv[at]
            s = msg + ((2 * q + d) * _K + i % _K) * 2
            mv[s] = 0                                       # its size first, then the count that makes it #i
            mv[s + 1] = whole << 8 | c
            mv[s] = mv[at] = i + 1
            self._sent = True
            if d == 0 and long and part.count > long:      # waits for its receiver's credit
                mv[at + 2] = i + 1

    def numbered(self, seq: int) -> None:
        """Collective #seq is numbered: what this rank issued before it, kept in its entry."""
        mv, r = self.mv, self.rank * self.row
        b = r + self.ent + (seq % NSIG) * self.esz
        if self._sent:                      # before this rank's first message its entries stay all zero
            w3 = 3 * self.world
            mv[b] = 0
            mv[b + 1:b + 1 + w3] = mv[r + 1:r + 1 + w3]
        mv[b] = seq
        mv[r] = seq

    # ---- reads (any thread) ----
    def find(self) -> str | None:
        """The lowest collective around which this rank and a peer issued a message in orders that wait on each
        other, told as order_text tells it (the same text on both ranks), else None."""
        best: tuple | None = None
        me = self.rank
        for p in self._peers:
            if not self._talk(p):
                continue
            for before, after in ((me, p), (p, me)):
                hit = self._cycle(before, after, best[0] if best else None)
                if hit is not None and (best is None or hit[:2] < best[:2]):    # by (s, after): one pick everywhere
                    best = hit
        return None if best is None else best[2]

    def _talk(self, p: int) -> bool:
        """This rank and p have issued a message to each other (counts only grow)."""
        mv, i, j = self.mv, self.rank * self.row + 1 + 3 * p, p * self.row + 1 + 3 * self.rank
        return bool(mv[i] or mv[i + 1] or mv[j] or mv[j + 1])

    def _cycle(self, b: int, a: int, upto: int | None) -> tuple | None:
        """(s, a, text) for the lowest collective #s (up to `upto`) that rank a has numbered, whose output needs
        rank b, where b issues before its #s a message that a issues after it; else None."""
        mv, base, out = self.mv, a * self.row + self.ent, None
        for i in range(NSIG):
            s = mv[base + i * self.esz]
            if not s or (upto is not None and s > upto) or (out is not None and s >= out[0]):
                continue
            theirs, mine = self._entry(a, b, s), self._before(b, a, s)
            if theirs is None or mine is None:
                continue
            if mine[1] > theirs[0]:             # b receives message #theirs[0], which a sends after #s
                what = (1, theirs[0])
            elif mine[2] > theirs[1]:           # b's long send, which a receives after #s
                what = (0, mine[2] - 1)
            else:
                continue
            words = self.sigs.entry(a, s)
            if words is not None and needs(words, a, b):
                out = (s, a, order_text(s, a, words, b, self._describe(b, a, *what)))
        return out

    def _entry(self, r: int, q: int, s: int) -> tuple | None:
        """Rank r's (sent, got, big) toward q before its collective #s, from its entry if kept."""
        mv = self.mv
        b = r * self.row + self.ent + (s % NSIG) * self.esz
        if mv[b] != s:
            return None
        i = b + 1 + 3 * q
        out = (mv[i], mv[i + 1], mv[i + 2])
        return out if mv[b] == s else None

    def _before(self, r: int, q: int, s: int) -> tuple | None:
        """Rank r's (sent, got, big) toward q before its collective #s: its live counts while it has not numbered
        #s (all it issued so far comes before), else its entry."""
        mv, row = self.mv, r * self.row
        if mv[row] < s:
            i = row + 1 + 3 * q
            out = (mv[i], mv[i + 1], mv[i + 2])
            if mv[row] < s:                     # still not numbered: none of these came after #s
                return out
        return self._entry(r, q, s)

    def _describe(self, r: int, q: int, d: int, i: int) -> str:
        """Rank r's message #i to (d 0) or from (d 1) rank q, as the cpu backend names a stalled lane."""
        mv = self.mv
        way = ("send", "to") if d == 0 else ("receive", "from")
        b = r * self.row + self.msg + ((2 * q + d) * _K + i % _K) * 2
        if mv[b] == i + 1:
            w = mv[b + 1]
            if mv[b] == i + 1 and (w & 0xFF) < len(DTYPES):
                return f"a {way[0]} of {w >> 8} x {DTYPES[w & 0xFF]} {way[1]} rank {q}"
        return f"a {way[0]} {way[1]} rank {q}"
