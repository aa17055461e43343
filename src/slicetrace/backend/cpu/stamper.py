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
Ring programs stage less (stage_ring): 6 ints per program (op, first steps, peers) and a slice's 3 or 4 clocks;
the program's RingLayout (once per cached program and stamp flags, worker.ring_layout) says which records those
words make, and publish() expands them with numpy per block of programs (_ring_entries). Staging 6 words per record
in the ring loop cost ~7k instructions per 1 MiB op more (scripts/cpu_op_icount.sh; docs/benchmarks.md).
"""
from __future__ import annotations

import threading
from array import array

import numpy as np

from ...stamps.layout import HEADER_DTYPE, STAMP_DTYPE, RingViews

_E = STAMP_DTYPE.itemsize // 8              # u64 words per entry
_H = HEADER_DTYPE.itemsize // 8             # u64 words per header
_W = 6                                      # words per staged record: wait, ready, done, op, step, w5
_HEAD = 6                                   # a ring program's staged words before its clocks (stage_ring)
_LO32, _SH32 = np.uint64(0xFFFFFFFF), np.uint64(32)
# u64 words: 'L' where it is 8 bytes (LP64) converts an int of 2+ digits (a clock) through PyLong_AsUnsignedLong's
# digit loop, ~2x fewer instructions than 'Q''s PyLong_AsUnsignedLongLong (_PyLong_AsByteArray); same range check
_U64 = "L" if array("L").itemsize == 8 else "Q"
assert _E == 6 and STAMP_DTYPE.fields["op"][1] == 32 and STAMP_DTYPE.fields["size"][1] == 40


def tail(peer: int, kind: int, flags: int) -> int:
    """The constant part of word 5 (all but size) for records of one peer, kind and direction."""
    return (peer & 0xFFFF) << 32 | kind << 48 | (flags & 0xFF) << 56


def _word_entries(words: array) -> np.ndarray:
    """stage()'s words as whole entries (seq word 0), so that publish copies each piece into a ring at once: a copy
    into rows[:, 1:] ran numpy's inner loop once per entry. Entry words 1..3 are staged words 0..2, one word on."""
    flat = np.frombuffer(words, np.uint64)
    staged = flat.reshape(-1, _W)
    ents = np.empty((len(staged), _E), np.uint64)
    ents.reshape(-1)[1:] = flat[:-1]
    ents[:, 0] = 0
    ents[:, 4] = (staged[:, 3] & _LO32) | (staged[:, 4] & _LO32) << _SH32
    ents[:, 5] = staged[:, 5]
    return ents


def _heads(words: np.ndarray) -> np.ndarray:
    """Staged heads (0, op, r0, rpeer, s0, speer; rows) as entry parts: 0, op, op | r0 << 32 (word 4 of a
    received slice's record, but for its step offset), rpeer << 32 (word 5, but for its constant part), the same
    for sent slices (u64, so a step keeps its low 32 bits, as the entry's field)."""
    words[:, 2:_HEAD] <<= _SH32
    words[:, 2:_HEAD:2] += words[:, 1:2]
    return words


def _ring_entries(clk: array, progs: list, one) -> np.ndarray:
    """Ring programs' records as whole entries: each word is a staged word of its program (_heads' or a clock; its
    layout's at says which) plus a constant of its layout (kt). numpy over all of them: a numpy call costs ~5k
    instructions here, a gathered word ~13, so the block of programs that all ran one layout whole (one: that
    layout; the usual block) takes a 2-D path of few calls. progs: (layout, words, records) per program."""
    flat = np.frombuffer(clk, np.uint64)
    if one:
        ents = _heads(flat.reshape(-1, one.w)).take(one.at1, axis=1)
        ents += one.kt1
        return ents.reshape(-1, _E)
    rows: dict = {}                     # the block's layouts in one table: layout -> its first row
    at, kt, meta = [], [], []
    nrows = off = nrec = 0
    for lay, n, k in progs:
        base = rows.get(lay)
        if base is None:
            base = rows[lay] = nrows
            nrows += len(lay.at)
            at.append(lay.at)
            kt.append(lay.kt)
        meta += (base - nrec, k, off)   # record j of the block: table row base - nrec + j
        nrec, off = nrec + k, off + n
    meta = np.array(meta, np.int64).reshape(-1, 3)
    ks, offs = meta[:, 1], meta[:, 2]
    head = offs[:, None] + np.arange(_HEAD)
    flat[head] = _heads(flat[head])
    idx = np.repeat(meta[:, 0], ks)
    idx += np.arange(nrec)
    ix = np.concatenate(at).take(idx, axis=0)
    ix += np.repeat(offs, ks)[:, None]
    ents = flat.take(ix)
    ents += np.concatenate(kt).take(idx, axis=0)
    return ents


class RingLayout:
    """A ring program's records as its staged words make them (stage_ring: _HEAD ints, then its clocks), in the
    writer's terms: per record, which of its program's words (after _heads) and which constant make each word of
    its entry (_ring_entries); done_at[w]: (records, slices sampled out) once w words are staged. recs: per record
    (wait, ready and done's indices among the clocks, 0 received / 1 sent / 2 KernelCh, step offset from its
    direction's first step, word 5 without the peer)."""
    __slots__ = ("at", "kt", "done_at", "w", "at1", "kt1")

    def __init__(self, recs: list, done_at: list):
        at, kt, h = [], [], _HEAD
        for c0, c1, c2, d, soff, w5 in recs:
            w4, p = (2 + 2 * d, 3 + 2 * d) if d < 2 else (1, 0)      # _heads: 0, op, op|r0<<32, rp<<32, ...
            at.append((0, c0 + h, c1 + h, c2 + h, w4, p))
            kt.append((0, 0, 0, 0, soff << 32 if d < 2 else 0, w5))
        self.at = np.array(at, np.int64).reshape(-1, _E)
        self.kt = np.array(kt, np.uint64).reshape(-1, _E)
        self.done_at = [None] * _HEAD + done_at
        self.w = len(self.done_at) - 1                          # words of a program staged whole
        self.at1, self.kt1 = self.at.ravel(), self.kt.ravel()   # all its records' at once


class FastRingWriter:
    __slots__ = ("hdr", "ri", "st_rows", "co_rows", "mask", "staged", "first", "lock", "pub",
                 "clk", "progs", "one", "blocks")

    def __init__(self, views: RingViews, channel: int):
        self.hdr = memoryview(views.header).cast("B").cast("Q")
        self.ri = channel * _H                                  # reserved; sampled_out is ri + 1
        self.st_rows = np.frombuffer(views.started[channel], np.uint64).reshape(views.slots, _E)
        self.co_rows = np.frombuffer(views.completed[channel], np.uint64).reshape(views.slots, _E)
        self.mask = views.slots - 1
        self.first = 0                  # the seq of the first record staged; 0: none
        self.lock = threading.Lock()
        self.pub = threading.Lock()     # one publisher at a time: an op's error path and a flush in another thread
        # Staged, oldest first: whole blocks, then p2p parts' words (stage()) or ring programs' clocks and ints
        # (stage_ring); a stage of the other kind closes the open block (_cut), so each block is one kind.
        self.blocks: list = []
        self.staged = array(_U64)       # [wait, ready, done, op, step, w5] per record
        self.clk = array(_U64)          # ring programs' staged words: per program _HEAD ints, then its clocks
        self.progs: list = []           # per ring program: (its RingLayout, words, records)
        self.one = None                 # the RingLayout they all ran whole; False: not so; None: no program

    def stage(self, words: list) -> None:
        """A channel program's records, 6 words each (wait, ready, done, op, step, w5; op and step as the
        entry's 32-bit fields take them), in order: their seqs are reserved now, as one block right after every
        record reserved before (all of this ring's); publish() writes them."""
        k = len(words) // _W
        if not k:
            return
        with self.lock:
            if self.progs:
                self._cut()
            self.staged.fromlist(words)     # before any seq is reserved: a word outside u64 raises, none reserved
            self._reserve(k)

    def stage_ring(self, words: list, lay: RingLayout) -> None:
        """A ring program's words: 0, op (the low 32 bits of its tag), its first receive step, the rank it
        receives from (low 16 bits), its first send step, the rank it sends to (low 16 bits), then its clocks in
        lay's order (whole slices only, also when a wait failed). Its records' seqs are reserved now, as stage()'s;
        the slices it sampled out are counted."""
        n = len(words)
        k, skipped = lay.done_at[n]
        with self.lock:
            if k:
                if self.staged:
                    self._cut()
                if self.one is not lay:         # the block's programs all ran lay whole, or not (False)
                    self.one = lay if not self.progs and n == lay.w else False
                elif n != lay.w:
                    self.one = False
                self.clk.fromlist(words)
                self.progs.append((lay, n, k))
                self._reserve(k)
            if skipped:
                self.hdr[self.ri + 1] += skipped

    def _reserve(self, k: int) -> None:
        """k seqs right after every one reserved before (lock held)."""
        hdr, ri = self.hdr, self.ri
        seq = hdr[ri] + 1
        hdr[ri] = seq + k - 1
        if not self.first:
            self.first = seq

    def _cut(self) -> None:
        """The open block (words or ring programs) closed (lock held): blocks is in seq order."""
        if self.progs:
            self.blocks.append((self.clk, self.progs, self.one))
            self.clk, self.progs, self.one = array(_U64), [], None
        elif self.staged:
            self.blocks.append(self.staged)
            self.staged = array(_U64)

    def publish(self) -> int:
        """Write every staged record into both rings (seq word 0, payload, then the seqs), as the reference
        RingWriter would have, one by one. Only the newest `slots` seqs can be in the ring: older staged ones are
        lapped (the reader counts them as overrun). Returns the records written."""
        with self.pub:
            return self._publish()

    def _publish(self) -> int:
        with self.lock:
            first = self.first
            if not first:
                return 0
            self._cut()
            blocks, self.blocks, self.first = self.blocks, [], 0
            last = self.hdr[self.ri] + 1                            # one past the newest seq: the last staged
        ents = [_ring_entries(*b) if type(b) is tuple else _word_entries(b) for b in blocks]
        ents = ents[0] if len(ents) == 1 else np.concatenate(ents)
        first = max(first, last - self.mask - 1)
        n = len(ents) - (last - first)                              # lapped: the newest `slots` only
        wrote = last - first
        while first < last:                                         # at most two pieces: the ring's end
            i = first & self.mask
            k = min(last - first, self.mask + 1 - i)
            seqs = np.arange(first, first + k, dtype=np.uint64)
            for rows in (self.st_rows, self.co_rows):   # started: wait, ready (done unread); completed: done
                rows[i:i + k] = ents[n:n + k]
            for rows in (self.st_rows, self.co_rows):
                rows[i:i + k, 0] = seqs                 # publish last
            first, n = first + k, n + k
        return wrote

    def sampled_out(self, n: int = 1) -> None:
        self.hdr[self.ri + 1] += n
