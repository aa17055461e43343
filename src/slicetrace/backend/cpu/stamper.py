"""Stamp writer of the cpu backend: stamps.layout's entries, payload first and seq last, in few Python steps.

Ring channel programs stage their records: a list extend per slice, the program's seqs reserved as one block at
its end, and publish() writes the staged entries vectorised, in the rank's own thread, before the drain reads
the ring (the backend's fetch_stamps; stamps.layout, "staged records"). Any Python call made right after a
slice's copy runs several times slower than hot (the copy evicted what it touches), so writing records between
slices cost ~1.2 us per call; a batch written once per drain poll costs ~0.1 us per record.
Point-to-point parts write each record at once (one(): struct.pack_into, then seq through a u64 memoryview).
Identity words are pre-combined the way the drain reads them (word 4 = op | step << 32, word 5 = size | peer <<
32 | kind << 48 | flags << 56). One writer thread per channel ring at a time (the contract).
"""
from __future__ import annotations

import struct
import threading

import numpy as np

from ...stamps.layout import FLAG_CH_STOP, HEADER_DTYPE, KIND_CHANNEL, KIND_STEP, STAMP_DTYPE, RingViews

_E = STAMP_DTYPE.itemsize // 8              # u64 words per entry
_H = HEADER_DTYPE.itemsize // 8             # u64 words per header
assert _E == 6 and STAMP_DTYPE.fields["op"][1] == 32 and STAMP_DTYPE.fields["size"][1] == 40
_ST1 = struct.Struct("<5Q").pack_into       # started words 1..5: wait ready done=0 w4 w5
_CO1 = struct.Struct("<3Q").pack_into       # completed words 3..5: done w4 w5 (its wait/ready stay 0)


def tail(peer: int, kind: int, flags: int) -> int:
    """The constant part of word 5 (all but size) for records of one peer, kind and direction."""
    return (peer & 0xFFFF) << 32 | kind << 48 | (flags & 0xFF) << 56


class FastRingWriter:
    __slots__ = ("hdr", "ri", "st", "co", "stq", "coq", "mask", "channel", "st_rows", "co_rows", "staged", "blocks",
                 "lock")

    def __init__(self, views: RingViews, channel: int):
        self.hdr = memoryview(views.header).cast("B").cast("Q")
        self.ri = channel * _H                                  # reserved; sampled_out is ri + 1
        self.st = memoryview(views.started[channel]).cast("B")
        self.co = memoryview(views.completed[channel]).cast("B")
        self.stq, self.coq = self.st.cast("Q"), self.co.cast("Q")
        self.st_rows = np.frombuffer(self.st, np.uint64).reshape(views.slots, _E)
        self.co_rows = np.frombuffer(self.co, np.uint64).reshape(views.slots, _E)
        self.mask = views.slots - 1
        self.channel = channel
        self.staged: list[int] = []             # [wait, ready, done, w4, w5] per staged record
        self.blocks: list[tuple[int, int]] = []  # (first seq, records) per staged program, in seq order
        self.lock = threading.Lock()            # stage() in a channel's thread, publish() in the drain's caller

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

    def stage(self, words: list) -> None:
        """A channel program's records, 5 words each (wait, ready, done, w4, w5), in order: their seqs are reserved
        now, as one block after every record reserved before; publish() writes them."""
        k = len(words) // 5
        if not k:
            return
        with self.lock:
            hdr, ri = self.hdr, self.ri
            first = hdr[ri] + 1
            hdr[ri] = first + k - 1
            self.staged += words
            self.blocks.append((first, k))

    def publish(self) -> int:
        """Write every staged record into both rings (payload with seq 0, then the seqs), as one() would have.
        Only seqs within `slots` of the newest reservation can be in the ring: older ones are lapped (overrun).
        Returns the records written."""
        with self.lock:
            words, blocks = self.staged, self.blocks
            if not blocks:
                return 0
            self.staged, self.blocks = [], []
        recs = np.array(words, dtype=np.uint64).reshape(-1, 5)
        first, last = blocks[0][0], blocks[-1][0] + blocks[-1][1]     # seqs first..last-1 if contiguous
        k = len(recs)
        if last - first != k:                                           # an immediate record came between
            seqs = np.concatenate([np.arange(f, f + n, dtype=np.uint64) for f, n in blocks])
            lo = int(np.searchsorted(seqs, self.hdr[self.ri] - self.mask))
            self._put((seqs[lo:] & np.uint64(self.mask)).astype(np.intp), recs[lo:], seqs[lo:])
            return k - lo
        first = max(first, self.hdr[self.ri] - self.mask)            # older seqs are lapped by newer ones
        k = last - first
        recs = recs[len(recs) - k:]
        while first < last:                                             # at most two pieces: the ring's end
            i = first & self.mask
            n = min(last - first, self.mask + 1 - i)
            self._put(slice(i, i + n), recs[:n], np.arange(first, first + n, dtype=np.uint64))
            recs, first = recs[n:], first + n
        return k

    def _put(self, at, recs: np.ndarray, seqs: np.ndarray) -> None:
        for rows in (self.st_rows, self.co_rows):   # started: wait, ready (done unread); completed: done
            rows[at, 0] = 0                         # unpublish the slot's old entry, write the payload,
            rows[at, 1:] = recs
        for rows in (self.st_rows, self.co_rows):
            rows[at, 0] = seqs                      # then publish

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
