"""Fast stamp writer: the bytes of stamps.layout's RingWriter, payload first and seq last, in fewer Python steps.

RingWriter assigns a numpy record per entry (several microseconds); this one packs the payload words with
struct.pack_into and stores seq through a u64 memoryview. Identity words are pre-combined the way the drain
reads them (word 4 = op | step << 32, word 5 = size | peer << 32 | kind << 48 | flags << 56), so a record is
two short packs and two seq stores. A slice that both receives and sends (recvReduceSend, ...) writes its two
records, at adjacent seqs, with one pack per ring: the seq word between them is packed as 0 (not published)
and both seqs are stored after the pack. One writer thread per channel ring (the contract).
"""
from __future__ import annotations

import struct

from ...stamps.layout import FLAG_CH_STOP, HEADER_DTYPE, KIND_CHANNEL, KIND_STEP, STAMP_DTYPE, RingViews

_E = STAMP_DTYPE.itemsize // 8              # u64 words per entry
_H = HEADER_DTYPE.itemsize // 8             # u64 words per header
assert _E == 6 and STAMP_DTYPE.fields["op"][1] == 32 and STAMP_DTYPE.fields["size"][1] == 40
_ST1 = struct.Struct("<5Q").pack_into       # started words 1..5: wait ready done=0 w4 w5
_CO1 = struct.Struct("<3Q").pack_into       # completed words 3..5: done w4 w5 (its wait/ready stay 0)
_ST2 = struct.Struct("<11Q").pack_into      # started: entry i words 1..5, seq(i+1) = 0, entry i+1 words 1..5
_CO2 = struct.Struct("<9Q").pack_into       # completed: entry i words 3..5, entry i+1 words 0..5 with seq 0


def tail(peer: int, kind: int, flags: int) -> int:
    """The constant part of word 5 (all but size) for records of one peer, kind and direction."""
    return (peer & 0xFFFF) << 32 | kind << 48 | (flags & 0xFF) << 56


class FastRingWriter:
    __slots__ = ("hdr", "ri", "st", "co", "stq", "coq", "mask", "channel")

    def __init__(self, views: RingViews, channel: int):
        self.hdr = memoryview(views.header).cast("B").cast("Q")
        self.ri = channel * _H                                  # reserved; sampled_out is ri + 1
        self.st = memoryview(views.started[channel]).cast("B")
        self.co = memoryview(views.completed[channel]).cast("B")
        self.stq, self.coq = self.st.cast("Q"), self.co.cast("Q")
        self.mask = views.slots - 1
        self.channel = channel

    def one(self, w4: int, w5: int, wait: int, ready: int, done: int) -> None:
        """A whole record (started and completed entries), written once its slice is posted.
        w4 = op | step << 32 (step & 0xFFFFFFFF), w5 = size | tail(peer, kind, flags)."""
        hdr, ri = self.hdr, self.ri
        seq = hdr[ri] + 1
        hdr[ri] = seq                                           # reserve before writing the payload
        i = seq & self.mask
        o = i * 48
        _ST1(self.st, o + 8, wait, ready, 0, w4, w5)
        self.stq[i * _E] = seq                                  # publish last
        _CO1(self.co, o + 24, done, w4, w5)
        self.coq[i * _E] = seq

    def two(self, a4: int, a5: int, aw: int, ar: int, b4: int, b5: int, bw: int, br: int, done: int) -> None:
        """Two records of one slice (a: the receive, b: the send) at adjacent seqs, done at the same clock."""
        hdr, ri, m = self.hdr, self.ri, self.mask
        seq = hdr[ri] + 1
        i = seq & m
        if i == m:                                              # the pair would straddle the ring's end
            self.one(a4, a5, aw, ar, done)
            self.one(b4, b5, bw, br, done)
            return
        hdr[ri] = seq + 1
        o = i * 48
        j = i * _E
        _ST2(self.st, o + 8, aw, ar, 0, a4, a5, 0, bw, br, 0, b4, b5)
        stq = self.stq
        stq[j] = seq
        stq[j + _E] = seq + 1
        _CO2(self.co, o + 24, done, a4, a5, 0, 0, 0, done, b4, b5)
        coq = self.coq
        coq[j] = seq
        coq[j + _E] = seq + 1

    def step(self, flags: int, op: int, step: int, size: int, peer: int, wait: int, ready: int,
             done: int) -> None:
        """A KernelStep record from its fields."""
        self.one(op & 0xFFFFFFFF | (step & 0xFFFFFFFF) << 32, size | tail(peer, KIND_STEP, flags), wait, ready, done)

    def channel_start(self, op: int, peer: int, flags: int, t: int) -> int:
        """KernelCh start record, completed at once (stamps.layout: never leave an entry open)."""
        self.one(op & 0xFFFFFFFF, tail(peer, KIND_CHANNEL, flags), t, t, t)
        return self.hdr[self.ri]

    def channel_stop(self, seq: int, op: int, peer: int, flags: int, t: int) -> None:
        """KernelCh stop: its own seq, after every slice of the program (`seq` of the start is unused)."""
        self.one(op & 0xFFFFFFFF, tail(peer, KIND_CHANNEL, flags | FLAG_CH_STOP), t, t, t)

    def sampled_out(self, n: int = 1) -> None:
        self.hdr[self.ri + 1] += n
