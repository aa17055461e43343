"""Fast stamp writer: the bytes of stamps.layout's RingWriter, payload first and seq last, in fewer Python steps.

RingWriter assigns a numpy record per entry (several microseconds); this one packs payload words with
struct.pack_into and stores seq words through a u64 memoryview. Identity words are pre-combined the way the drain
reads them (word 4 = op | step << 32, word 5 = size | peer << 32 | kind << 48 | flags << 56).

Ring programs batch (`pend` + `flush`): the worker appends each record's started and completed words to two
lists as its slice is posted (two C-level list extends, where a write to the ring costs ~1.2 us among the data
path's copies) and publishes them at the end of the program or every FLUSH_AT records: every seq reserved first,
then one pack of all payloads per ring (the seq words inside it 0: not published), then the seq words, one
strided store per ring. The drain of the synchronous cpu backend reads between ops, so it sees the same records
in the same seq order as with one write per record. Point-to-point parts write each record at once (`one`).
One writer thread per channel ring (the contract).
"""
from __future__ import annotations

import struct
from array import array
from typing import Any

from ...stamps.layout import FLAG_CH_STOP, HEADER_DTYPE, KIND_CHANNEL, KIND_STEP, STAMP_DTYPE, RingViews

_E = STAMP_DTYPE.itemsize // 8              # u64 words per entry
_H = HEADER_DTYPE.itemsize // 8             # u64 words per header
assert _E == 6 and STAMP_DTYPE.fields["op"][1] == 32 and STAMP_DTYPE.fields["size"][1] == 40
_ST1 = struct.Struct("<5Q").pack_into       # started words 1..5: wait ready done=0 w4 w5
_CO1 = struct.Struct("<3Q").pack_into       # completed words 3..5: done w4 w5 (its wait/ready stay 0)
FLUSH_AT = 64                               # pending records that make a program publish before its end
_PACKS: dict[int, Any] = {}


def tail(peer: int, kind: int, flags: int) -> int:
    """The constant part of word 5 (all but size) for records of one peer, kind and direction."""
    return (peer & 0xFFFF) << 32 | kind << 48 | (flags & 0xFF) << 56


def _pack(words: int) -> Any:
    p = _PACKS.get(words)
    if p is None:
        p = _PACKS[words] = struct.Struct(f"<{words}Q").pack_into
    return p


class FastRingWriter:
    __slots__ = ("hdr", "ri", "st", "co", "stq", "coq", "mask", "channel", "ps", "pc")

    def __init__(self, views: RingViews, channel: int):
        self.hdr = memoryview(views.header).cast("B").cast("Q")
        self.ri = channel * _H                                  # reserved; sampled_out is ri + 1
        self.st = memoryview(views.started[channel]).cast("B")
        self.co = memoryview(views.completed[channel]).cast("B")
        self.stq, self.coq = self.st.cast("Q"), self.co.cast("Q")
        self.mask = views.slots - 1
        self.channel = channel
        self.ps: list[int] = []         # pending started entries, 6 words each (seq word 0)
        self.pc: list[int] = []         # pending completed entries, 6 words each (seq, wait, ready 0)

    def pend(self, w4: int, w5: int, wait: int, ready: int, done: int) -> None:
        """A record for the next flush (hot loops append to ps/pc themselves, in this layout)."""
        self.ps.extend((0, wait, ready, 0, w4, w5))
        self.pc.extend((0, 0, 0, done, w4, w5))

    def flush(self) -> None:
        """Publish the pending records, in the order they were added."""
        ps, pc = self.ps, self.pc
        n = len(ps) // _E
        if not n:
            return
        hdr, ri = self.hdr, self.ri
        base = hdr[ri] + 1
        hdr[ri] = base + n - 1                                  # reserve every seq before any payload
        i0 = base & self.mask
        k = min(n, self.mask + 1 - i0)                          # entries before the ring's end
        for a, b, slot in ((0, k, i0), (k, n, 0)):
            if a < b:                                           # words 1.. of entry a through entry b - 1
                _pack((b - a) * _E - 1)(self.st, slot * 48 + 8, *ps[a * _E + 1:b * _E])
                _pack((b - a) * _E - 1)(self.co, slot * 48 + 8, *pc[a * _E + 1:b * _E])
        for a, b, slot in ((0, k, i0), (k, n, 0)):              # publish last
            if a < b:
                seqs = array("Q", range(base + a, base + b))
                self.stq[slot * _E:(slot + b - a) * _E:_E] = seqs
                self.coq[slot * _E:(slot + b - a) * _E:_E] = seqs
        ps.clear()
        pc.clear()

    def one(self, w4: int, w5: int, wait: int, ready: int, done: int) -> None:
        """A whole record (started and completed entries) written now.
        w4 = op | step << 32 (step & 0xFFFFFFFF), w5 = size | tail(peer, kind, flags)."""
        if self.ps:
            self.flush()                                        # keep seq order with pending records
        hdr, ri = self.hdr, self.ri
        seq = hdr[ri] + 1
        hdr[ri] = seq                                           # reserve before writing the payload
        i = seq & self.mask
        o = i * 48
        _ST1(self.st, o + 8, wait, ready, 0, w4, w5)
        self.stq[i * _E] = seq                                  # publish last
        _CO1(self.co, o + 24, done, w4, w5)
        self.coq[i * _E] = seq

    def step(self, flags: int, op: int, step: int, size: int, peer: int, wait: int, ready: int,
             done: int) -> None:
        """A KernelStep record from its fields, written now."""
        self.one(op & 0xFFFFFFFF | (step & 0xFFFFFFFF) << 32, size | tail(peer, KIND_STEP, flags), wait, ready, done)

    def channel_start(self, op: int, peer: int, flags: int, t: int) -> None:
        """KernelCh start record, completed at once (stamps.layout: never leave an entry open)."""
        self.one(op & 0xFFFFFFFF, tail(peer, KIND_CHANNEL, flags), t, t, t)

    def channel_stop(self, op: int, peer: int, flags: int, t: int) -> None:
        """KernelCh stop: its own seq, after every slice of the program."""
        self.one(op & 0xFFFFFFFF, tail(peer, KIND_CHANNEL, flags | FLAG_CH_STOP), t, t, t)

    def sampled_out(self, n: int = 1) -> None:
        self.hdr[self.ri + 1] += n
