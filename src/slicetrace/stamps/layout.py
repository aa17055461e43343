"""Device <-> host contract: the stamp record, the ring memory layout and the publish protocol.

Per channel there is one header and two rings of N entries each: *started* and *completed*.
A writer (CPU worker thread or CUDA block) publishes one stamp like this:

    seq = ++header.reserved            # reserve first (per-channel counter, starts at 1)
    write the payload of started[seq % N] (kind, flags, op, step, size, peer, wait, ready)
    fence                              # system scope on the GPU; program order on x86
    started[seq % N].seq = seq         # publish last
    ... the slice moves ...
    write the payload of completed[seq % N] (same identity fields, done), fence, completed[...].seq = seq

The reader accepts entry e only when its seq field equals e AND a read of `reserved` made *after*
copying the payload is < e + N (nobody has reserved the seq that reuses the slot, so the payload is
intact). Entries may become visible out of order; the reader never assumes e is visible before e+1.
KernelCh boundaries use the same rings (kind=KIND_CHANNEL) as two separate, immediately completed records:
a *start* record before the program's first slice and a *stop* record (flags |= FLAG_CH_STOP) after its
last, each with its own seq, started and completed entries written at once (ready = done = the clock). A
record must never stay open across many later seqs: its completed slot would be reused. Since the stop's
seq is reserved after every slice of the program, an in-order reader sees all of a program's KernelSteps
before its KernelCh stop.

A GPU writer (backend/cuda) follows these rules instead, so that stamping costs no fence and leaves no store
to host memory pending in front of the data path's fences:
- the host reserves each channel program's range of seqs at submit (header.reserved moves before the
  launch; the kernel never writes it) and passes the range in the launch arguments. A program's KernelCh
  start and stop take the first two seqs of its range, its KernelSteps the rest, in slice order;
- the kernel writes each record once, whole (wait, ready and done in one entry), seq word included, with no
  fence, as a *provisional* seq word: SEQ_PROVISIONAL | (op & 0x7FFFFFFF) << 32 | (seq & 0xFFFFFFFF), into
  one ring per channel in its own device memory. The host mirror is a *merged* RingViews: `started` and
  `completed` are the same ring, so the reader pairs an entry with itself. Once op has completed, the reader
  copies the windows of its seqs into that mirror (Drain's `fetch`) and trusts the provisional words of that
  op, so a record may be seen late but never taken early; lapping is still caught by the header, which the
  host wrote before the launch. (A device ring is read only after its op completed, so a separate started
  entry would tell the host nothing more, and would cost the kernel three more stores per record.)
An in-order reader therefore takes a GPU program whole once its op has completed, and since every seq of
the op is reserved at submit, an entry of a completed op that is still not valid was lost (counted).

Staged records (backend/cpu): the writer keeps a channel program's records (or a p2p part's) in its own memory
while it runs and reserves their seqs as one block when it ends (KernelCh start, KernelSteps, KernelCh stop, in
order); the backend's fetch_stamps writes the payloads and then the seq words, by the rules above, before the
drain reads the ring, so the reader sees exactly what per-record writes would have left (entries lapped by newer
reservations are not written: the reader counts them as overrun).

This module imports nothing from slicetrace but errors; both backends and the drain import it.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError

KIND_STEP = 0        # one slice of a Simple-protocol primitive
KIND_CHANNEL = 1     # KernelCh: a channel's whole share of one operation
FLAG_SEND = 1        # the slice was sent (else received); for KernelCh: the p2p program sends
FLAG_CH_STOP = 2     # KernelCh record that closes the program (else it opens it)
SEQ_PROVISIONAL = 1 << 63   # seq word published without a fence: valid once its op completed (see above)

# 48 bytes. Offsets are part of the contract: the CUDA kernel writes the same layout (kernels/engine.cuh id0, id1).
STAMP_DTYPE = np.dtype([
    ("seq", "<u8"),      # published last; 0 = never written
    ("wait", "<u8"),     # started ring: clock when the wait for credit (send) or data (recv) began
    ("ready", "<u8"),    # started ring: wait satisfied, copy/reduce begins (KernelCh: start clock)
    ("done", "<u8"),     # completed ring: slice posted to the peer (KernelCh: stop clock)
    ("op", "<u4"),       # work tag: the communicator's operation counter (low 32 bits), routes to the parent
    ("step", "<u4"),     # FIFO step number on the connection (low 32 bits)
    ("size", "<u4"),     # bytes moved by the slice
    ("peer", "<u2"),     # communicator rank of the peer
    ("kind", "u1"),      # KIND_STEP or KIND_CHANNEL
    ("flags", "u1"),     # FLAG_SEND
])
assert STAMP_DTYPE.itemsize == 48

# One 64-byte header per channel, so channels never share a cache line.
HEADER_DTYPE = np.dtype([
    ("reserved", "<u8"),     # last reserved seq (0 = none yet)
    ("sampled_out", "<u8"),  # slices skipped by sampling (counted by the writer)
    ("pad", "<u8", (6,)),
])
assert HEADER_DTYPE.itemsize == 64

# Paired record handed by the drain to the event host: one per KernelStep or KernelCh; flags holds FLAG_SEND only.
# Its first 72 bytes have the layout of events.abi.KERNEL_STEP_DTYPE (flags in is_send's byte), so a KernelStep
# batch is a view of them; events.ops asserts it.
PAIRED_DTYPE = np.dtype([
    ("channel", "<u2"), ("flags", "u1"), ("peer", "<i4"), ("step", "<u8"), ("size", "<u8"),
    ("wait", "<u8"), ("ready", "<u8"), ("done", "<u8"),          # raw device clocks (ns)
    ("wait_ns", "<i8"), ("ready_ns", "<i8"), ("done_ns", "<i8"),  # host timeline (CLOCK_MONOTONIC ns)
    ("op", "<u4"), ("kind", "u1"),
], align=True)    # aligned fields: numpy copies packed (unaligned) records several times slower


def take_rows(a: np.ndarray, sel: np.ndarray) -> np.ndarray:
    """a[sel] for a 1-D structured array (sel: indices or a bool mask), as one gather of byte rows: numpy's
    own fancy indexing copies structured items one by one (~30x slower for these records)."""
    if sel.dtype == np.bool_:
        sel = np.flatnonzero(sel)
    rows = a[:, None].view(np.uint8)          # (n, itemsize) bytes, strided views included
    return np.take(rows, sel, axis=0).view(a.dtype).reshape(-1)


def provisional_word(seq: int, op: int) -> int:
    return SEQ_PROVISIONAL | (op & 0x7FFFFFFF) << 32 | (seq & 0xFFFFFFFF)


def check_slots(n: int) -> int:
    if n < 64 or n & (n - 1):
        raise ConfigError(f"ring_slots={n} must be a power of two >= 64")
    return n


def ring_bytes(nchannels: int, slots: int, merged: bool = False) -> int:
    """Bytes of one communicator's stamp memory: headers, then started rings, then completed rings (merged:
    one ring per channel, read as both)."""
    check_slots(slots)
    return nchannels * HEADER_DTYPE.itemsize + (1 if merged else 2) * nchannels * slots * STAMP_DTYPE.itemsize


class RingViews:
    """numpy views over stamp memory laid out by ring_bytes(); the memory is owned by the backend."""

    def __init__(self, buf, nchannels: int, slots: int, merged: bool = False):
        check_slots(slots)
        need = ring_bytes(nchannels, slots, merged)
        mv = memoryview(buf).cast("B")
        if len(mv) < need:
            raise ConfigError(f"stamp buffer has {len(mv)} bytes, needs {need} for {nchannels} channels x {slots} slots")
        self.nchannels, self.slots, self.merged = nchannels, slots, merged
        h = nchannels * HEADER_DTYPE.itemsize
        r = nchannels * slots * STAMP_DTYPE.itemsize
        self.header = np.frombuffer(mv[:h], dtype=HEADER_DTYPE)
        self.started = np.frombuffer(mv[h:h + r], dtype=STAMP_DTYPE).reshape(nchannels, slots)
        self.completed = self.started if merged else \
            np.frombuffer(mv[h + r:h + 2 * r], dtype=STAMP_DTYPE).reshape(nchannels, slots)

    def reset(self) -> None:
        self.header[:] = 0
        self.started[:] = 0
        self.completed[:] = 0


class RingWriter:
    """Reference writer for one channel (CPU backend, null backend, tests). One thread per channel."""

    __slots__ = ("_hdr", "_st", "_co", "_mask", "_ch")

    def __init__(self, views: RingViews, channel: int):
        self._hdr = views.header[channel:channel + 1]
        self._st = views.started[channel]
        self._co = views.completed[channel]
        self._mask = views.slots - 1
        self._ch = channel

    def start(self, kind: int, flags: int, op: int, step: int, size: int, peer: int, wait: int, ready: int) -> int:
        seq = int(self._hdr["reserved"][0]) + 1
        self._hdr["reserved"] = seq                       # reserve before writing the payload
        self._st[seq & self._mask] = (0, wait, ready, 0, op & 0xFFFFFFFF, step & 0xFFFFFFFF, size, peer, kind, flags)
        self._st["seq"][seq & self._mask] = seq           # publish last
        return seq

    def complete(self, seq: int, kind: int, flags: int, op: int, step: int, size: int, peer: int, done: int) -> None:
        i = seq & self._mask
        self._co[i] = (0, 0, 0, done, op & 0xFFFFFFFF, step & 0xFFFFFFFF, size, peer, kind, flags)
        self._co["seq"][i] = seq

    def channel(self, stop: bool, flags: int, op: int, peer: int, clock: int) -> int:
        """A KernelCh start or stop record: reserved, written and completed at once."""
        f = flags | (FLAG_CH_STOP if stop else 0)
        seq = self.start(KIND_CHANNEL, f, op, 0, 0, peer, clock, clock)
        self.complete(seq, KIND_CHANNEL, f, op, 0, 0, peer, clock)
        return seq

    def provisional(self, seq: int, op: int) -> None:
        """Republish seq the way a GPU program's last records are published (SEQ_PROVISIONAL)."""
        word = provisional_word(seq, op)
        self._st["seq"][seq & self._mask] = word
        self._co["seq"][seq & self._mask] = word

    def sampled_out(self, n: int = 1) -> None:
        self._hdr["sampled_out"] += n


_PROV, _LO32, _LO31 = np.uint64(SEQ_PROVISIONAL), np.uint64(0xFFFFFFFF), np.uint64(0x7FFFFFFF)


def decode_rows(st: np.ndarray, co: np.ndarray, chan, kind: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Started and completed entries (uint64 words, STAMP_DTYPE's order) -> PAIRED_DTYPE rows in `out`: op, step,
    size, peer, kind (given: the caller has it), flags, channel (an array, or one int), the three clocks."""
    w4, w5 = st[:, 4], st[:, 5]
    out["op"] = w4                               # the low 32 bits (unsafe cast)
    out["step"] = w4 >> np.uint64(32)
    out["size"] = w5 & _LO32
    out["peer"] = (w5 >> np.uint64(32)) & np.uint64(0xFFFF)
    out["kind"] = kind
    out["flags"] = w5 >> np.uint64(56)
    out["channel"] = chan
    out["wait"], out["ready"], out["done"] = st[:, 1], st[:, 2], co[:, 3]
    return out


def published(word: np.ndarray, useq: np.ndarray, done31: np.ndarray) -> np.ndarray:
    """Seq words that publish useq: plain, or provisional from an op that has completed (stamps.layout)."""
    prov = (((word & _PROV) != 0) & ((word & _LO32) == (useq & _LO32))
            & member((word >> np.uint64(32)) & _LO31, done31))
    return (word == useq) | prov


def member(x: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """np.isin(x, vals) for unique vals; a poll's completed ops are usually consecutive tags: two compares."""
    if len(vals):
        lo, hi = vals.min(), vals.max()
        if int(hi) - int(lo) + 1 == len(vals):
            return (x >= lo) & (x <= hi)
    return np.isin(x, vals)
