"""Stamp writer of the cpu backend: stamps.layout's entries, payload first and seq last, in few Python steps.

Channel programs (ring and point-to-point parts) stage their records: a list extend per slice, the program's seqs
reserved as one block when it ends, and publish() writes what is staged with a few numpy assignments, in the
rank's own thread, before the drain reads the ring (the backend's fetch_stamps; stamps.layout, "staged records").
Any Python call made right after a slice's copy runs several times slower than hot (the copy evicted what it
touches): writing records between slices cost ~1.2 us per call, publishing at each program's end as much; once
per drain poll it is ~0.1 us per record. A staged record is 6 words: wait, ready, done, op, step and word 5
pre-combined the way the drain reads it (size | peer << 32 | kind << 48 | flags << 56); publish() joins op and step
into word 4 (op | step << 32) for all of a poll at once, which costs the ring loop ~1 us less per 1 MiB op than
joining them per slice (scripts/cpu_ks_loopback.py). stage() packs a program's words into a u64 array while they
are still in cache: converting them at publish, after 32 ops of copies, cost ~1 us more per op. One writer thread
per channel ring at a time (the contract); the lock only keeps a flush from another thread off a program that is
staging.
"""
from __future__ import annotations

import threading
from array import array

import numpy as np

from ...stamps.layout import HEADER_DTYPE, STAMP_DTYPE, RingViews

_E = STAMP_DTYPE.itemsize // 8              # u64 words per entry
_H = HEADER_DTYPE.itemsize // 8             # u64 words per header
_W = 6                                      # words per staged record: wait, ready, done, op, step, w5
_LO32 = np.uint64(0xFFFFFFFF)
# u64 words: 'L' where it is 8 bytes (LP64) converts an int of 2+ digits (a clock) through PyLong_AsUnsignedLong's
# digit loop, ~2x fewer instructions than 'Q''s PyLong_AsUnsignedLongLong (_PyLong_AsByteArray); same range check
_U64 = "L" if array("L").itemsize == 8 else "Q"
assert _E == 6 and STAMP_DTYPE.fields["op"][1] == 32 and STAMP_DTYPE.fields["size"][1] == 40


def tail(peer: int, kind: int, flags: int) -> int:
    """The constant part of word 5 (all but size) for records of one peer, kind and direction."""
    return (peer & 0xFFFF) << 32 | kind << 48 | (flags & 0xFF) << 56


class FastRingWriter:
    __slots__ = ("hdr", "ri", "st_rows", "co_rows", "mask", "staged", "first", "lock", "pub")

    def __init__(self, views: RingViews, channel: int):
        self.hdr = memoryview(views.header).cast("B").cast("Q")
        self.ri = channel * _H                                  # reserved; sampled_out is ri + 1
        self.st_rows = np.frombuffer(views.started[channel], np.uint64).reshape(views.slots, _E)
        self.co_rows = np.frombuffer(views.completed[channel], np.uint64).reshape(views.slots, _E)
        self.mask = views.slots - 1
        self.staged = array(_U64)       # [wait, ready, done, op, step, w5] per record, seqs first.. (contiguous)
        self.first = 0
        self.lock = threading.Lock()
        self.pub = threading.Lock()     # one publisher at a time: an op's error path and a flush in another thread

    def stage(self, words: list) -> None:
        """A channel program's records, 6 words each (wait, ready, done, op, step, w5; op and step as the
        entry's 32-bit fields take them), in order: their seqs are reserved now, as one block right after every
        record reserved before (all of this ring's); publish() writes them."""
        k = len(words) // _W
        if not k:
            return
        with self.lock:
            staged = self.staged
            empty = not staged
            staged.fromlist(words)      # before any seq is reserved: a word outside u64 raises, staged unchanged
            hdr, ri = self.hdr, self.ri
            seq = hdr[ri] + 1
            hdr[ri] = seq + k - 1
            if empty:
                self.first = seq

    def publish(self) -> int:
        """Write every staged record into both rings (seq word 0, payload, then the seqs), as the reference
        RingWriter would have, one by one. Only the newest `slots` seqs can be in the ring: older staged ones are
        lapped (the reader counts them as overrun). Returns the records written."""
        with self.pub:
            return self._publish()

    def _publish(self) -> int:
        with self.lock:
            words, first = self.staged, self.first
            if not words:
                return 0
            self.staged = array(_U64)
            last = self.hdr[self.ri] + 1                            # one past the newest seq: the last staged
        first = max(first, last - self.mask - 1)
        flat = np.frombuffer(words, np.uint64)[(len(words) // _W - (last - first)) * _W:]
        staged = flat.reshape(-1, _W)
        # Whole entries (seq word 0), so that each piece below is one contiguous copy per ring: a copy into
        # rows[:, 1:] ran numpy's inner loop once per entry. Entry words 1..3 are staged words 0..2, one word on.
        ents = np.empty((len(staged), _E), np.uint64)
        ents.reshape(-1)[1:] = flat[:-1]
        ents[:, 0] = 0
        ents[:, 4] = (staged[:, 3] & _LO32) | (staged[:, 4] & _LO32) << np.uint64(32)
        ents[:, 5] = staged[:, 5]
        n = 0
        while first < last:                                         # at most two pieces: the ring's end
            i = first & self.mask
            k = min(last - first, self.mask + 1 - i)
            seqs = np.arange(first, first + k, dtype=np.uint64)
            for rows in (self.st_rows, self.co_rows):   # started: wait, ready (done unread); completed: done
                rows[i:i + k] = ents[n:n + k]
            for rows in (self.st_rows, self.co_rows):
                rows[i:i + k, 0] = seqs                 # publish last
            first, n = first + k, n + k
        return n

    def sampled_out(self, n: int = 1) -> None:
        self.hdr[self.ri + 1] += n
