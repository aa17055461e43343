"""Chrome-trace text for the example plugin (sinks/chrome.py): line templates and small formatters."""
from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from ..events.abi import process_label

# KernelCh b/e pair and KernelStep X record, filled by one % over a block of int columns.
CH_LINES = ('{"name":"KernelCh","cat":"GPU","id":%d,"pid":%d,"tid":1,"ph":"b","ts":%d.%03d,'
             '"args":{"Channel":%d,"StartGpuClk":%d,"StopGpuClk":%d,"ParentId":%d}},\n'
             '{"name":"KernelCh","cat":"GPU","id":%d,"pid":%d,"tid":1,"ph":"e","ts":%d.%03d},\n')
STEP_LINE = ('{"name":"KernelStep","cat":"GPU","ph":"X","pid":%d,"tid":%d,"ts":%d.%03d,"dur":%d.%03d,'
              '"args":{"Channel":%d,"IsSend":%d,"Peer":%d,"Step":%d,"Size":%d,"WaitGpuClk":%d,"StartGpuClk":%d,'
              '"StopGpuClk":%d,"SeqNum":%d,"ParentId":%d}},\n')


# Coll / P2p b records and their e record (sinks/chrome.py's fast path; `pair` is the general one).
COLL_B = ('{"name":%s,"cat":"COLL","id":%d,"pid":%d,"tid":1,"ph":"b","ts":%d.%03d,"args":{"SeqNum":%d,'
          '"CommHash":%d,"Rank":%d,"Count":%d,"Datatype":%s,"Algorithm":%s,"Protocol":%s,"nChannels":%d,'
          '"ParentId":%d}},\n')
P2P_B = ('{"name":%s,"cat":"P2P","id":%d,"pid":%d,"tid":1,"ph":"b","ts":%d.%03d,"args":{"CommHash":%d,'
         '"Rank":%d,"Peer":%d,"Count":%d,"Datatype":%s,"nChannels":%d,"ParentId":%d}},\n')
OP_E = '{"name":%s,"cat":"%s","id":%d,"pid":%d,"tid":1,"ph":"e","ts":%d.%03d},\n'
UNFINISHED_KCH = "UnfinishedKernelCh"      # an op's e arg: it ended without this many KernelCh (event_unfinished)
_JS: dict = {}


def js(v: Any) -> str:
    """json.dumps of a descriptor's string field, cached (a few distinct names per run)."""
    out = _JS.get(v)
    if out is None:
        out = json.dumps(v, default=str)
        if len(_JS) < 4096:
            _JS[v] = out
    return out


def us(ns: int) -> str:
    q, r = divmod(int(ns), 1000)
    return f"{q}.{r:03d}" if q >= 0 else f"{ns / 1000:.3f}"


def distinct(v: np.ndarray, peel: int = 8) -> list[int]:
    """The distinct values of v. A block of KernelSteps has a few tracks (a channel's two directions): taken off
    one at a time, ~10 instructions a row each, where np.unique hashes every row (~185); past `peel`, np.unique."""
    out = []
    while len(v) and len(out) < peel:
        t = int(v[0])
        out.append(t)
        v = v[v != t]
    return out + np.unique(v).tolist() if len(v) else out


def step_tid(channel: int, is_send: int, peer: int) -> int:
    return 1_000_000 + channel * 131072 + (1 if is_send else 0) * 65536 + (peer & 0xFFFF)


def _mix(comm_hash: int, rank: int) -> int:
    """64 well-mixed bits of (communicator, rank): splitmix64's finaliser over the hash, then over that + rank."""
    return _fin((_fin(int(comm_hash) & _M64) + int(rank) * 0x9E3779B97F4A7C15) & _M64)


def _fin(z: int) -> int:
    z = ((z ^ z >> 30) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ z >> 27) * 0x94D049BB133111EB) & _M64
    return z ^ z >> 31


_M64 = (1 << 64) - 1


def trace_pid(comm_hash: int, rank: int) -> int:
    """The pid of a communicator's rank in a merged trace: one process per rank and communicator (two
    communicators of one process would otherwise share one), never 0 (Perfetto's idle process), below 2**31
    (the analyzer's int32 pid); two (communicator, rank) pairs of M meet with odds ~M**2 / 2**32. The rank itself
    is in the process name and in slicetrace_comm's args.Rank, which the analyzer reads."""
    return 1 + _mix(comm_hash, rank) % 0x7FFFFFFE


ID_SPAN = 1 << 26        # async ids of one file's own


def id_base(comm_hash: int, rank: int, span: int = 0) -> int:
    """The first async id of a file: 27 bits of (communicator, rank) above ID_SPAN ids of its own, so ids stay
    under 2**53 (exact as doubles: spreadsheets, JavaScript viewers) and differ across the merged files of every
    communicator (odds ~M**2 / 2**28). span k > 0: the base of the file's next span once k are spent, drawn alike."""
    m = _mix(comm_hash, rank)
    return ((_fin((m + span) & _M64) if span else m) >> 37) << 26


def pair(ev_id: int, pid: int, name: str, cat: str, ts0: int, ts1: int, args: dict) -> list[str]:
    """An async b/e record pair (same cat and id), as Perfetto pairs them."""
    nm = json.dumps(name)
    head = f'{{"name":{nm},"cat":"{cat}","id":{ev_id},"pid":{pid},"tid":1,'
    return [f'{head}"ph":"b","ts":{us(ts0)},"args":{json.dumps(args, default=str)}}},\n',
            f'{head}"ph":"e","ts":{us(ts1)}}},\n']


def unfinished_end(line: str, missing: int) -> str:
    """An op's e record (OP_E's or pair's line) with the arg saying it ended `missing` KernelCh short."""
    return f'{line[:-3]},"args":{{"{UNFINISHED_KCH}":{int(missing)}}}}},\n'


def _meta(pid: int, name: str, tid: int, args: dict) -> str:
    return json.dumps({"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}, separators=(",", ":")) + ",\n"


def _track(pid: int, tid: int, name: str) -> str:
    """A track's name and its place: its tid (ops, proxy, then the KernelStep tracks by channel, receives before
    sends, by peer, as convert orders them), for viewers that order tracks by sort index (Perfetto v53+ keeps it
    as thread_sort_index_hint and orders a process's threads by tid; chrome://tracing by sort index, then name)."""
    return _meta(pid, "thread_name", tid, {"name": name}) + _meta(pid, "thread_sort_index", tid, {"sort_index": tid})


def process_meta(pid: int, r: int, comm_hash: int, lost: dict[str, int] | None = None,
                 failed: str | None = None) -> str:
    """The process name (rank r of communicator comm_hash, with the error class it failed in and its losses) and
    sort index (Perfetto v53+ and chrome://tracing order processes by it first: ranks in rank order), and the
    names of the ops and proxy tracks: written first, so a file cut short (a rank killed) still names them."""
    out = _meta(pid, "process_name", 0, {"name": process_label(r, comm_hash, lost, failed)})
    if lost or failed:      # finalize's: a viewer keeps the last name, and shows the counters record nowhere
        return out
    return (out + _meta(pid, "process_sort_index", 0, {"sort_index": r})
            + _track(pid, 1, "ops") + _track(pid, 2, "proxy"))


def failure_line(pid: int, f: Any) -> str:
    """An op's failure (events.plugin.Failure) as an instant on the rank's process, named by its error class and its
    message's first line (what a viewer shows), with the whole message and the op and SeqNum where known."""
    args = {"Error": f.error, "Message": f.message, **({} if f.op is None else {"Op": f.op}),
            **({} if f.seq is None else {"SeqNum": f.seq})}
    name = f"{f.error}: {(f.message.splitlines() or [''])[0]}"
    return (f'{{"name":{json.dumps(name)},"cat":"ERROR","ph":"i","s":"p","pid":{pid},"tid":1,"ts":{us(f.ts_ns)},'
            f'"args":{json.dumps(args)}}},\n')


def thread_meta(pid: int, tids: Any) -> str:
    """The names and places of KernelStep tracks, one per (channel, direction, peer) in `tids`."""
    return "".join(_track(pid, step_tid(ch, snd, peer), f"ch {ch} send->{peer}" if snd else f"ch {ch} recv<-{peer}")
                   for ch, snd, peer in sorted(tids))


def proxy_text(pid: int, spans: Any) -> str:
    """ProxyCtrl "X" spans (begin ns, end ns, name, args text) on the proxy track in time order, an enclosing span
    before those it holds: made as each ends, they come out of order (Perfetto sorts; chrome://tracing's legacy
    importer and scripts may not). Sorted once, at finalize, never per span."""
    return "".join(f'{{"name":"{name}","cat":"PROXY","ph":"X","pid":{pid},"tid":2,"ts":{us(t0)},'
                   f'"dur":{us(max(t1 - t0, 0))}{args}}},\n'
                   for t0, t1, name, args in sorted(spans, key=lambda s: (s[0], -s[1])))


def _table(pad: bytes) -> np.ndarray:
    """Words "0000".."9999" (index < 10000), then the same with leading zeros as spaces and 0 as `pad`."""
    z = [b"%04d" % i for i in range(10000)]
    sp = [pad] + [b"%4d" % i for i in range(1, 10000)]
    return np.frombuffer(b"".join(z + sp), np.uint32)


_MID = _table(b"    ")       # a 4-digit group above a value's first digit is blank
_LAST = _table(b"   0")      # the last group always shows a digit
_DOT = np.frombuffer(b"".join(b".%03d" % i for i in range(1000)), np.uint32)     # ".000".."999"
_SMALL = 64                  # fewer rows: one % over the block is cheaper


class RowFormat:
    """`line` (a template of %d and %03d fields) filled for a block of int64 rows at once: each %d field takes
    the width of the block's widest value and narrower values are padded with spaces (JSON whitespace), so the
    digits come from whole-column arithmetic (4-digit groups from a table), never from Python per value.
    Returns bytes (ASCII). A block with a negative value (or a %03d field >= 1000) is one % over the block.
    compact: no padding (the padded digits' leading spaces are cut out), so each row is `line % row` exactly."""

    def __init__(self, line: str, compact: bool = False):
        parts = re.split(r"(%03d|%d)", line)
        self.line, self.compact = line, compact
        self.lits = [p.encode("ascii") for p in parts[0::2]]
        self.fixed = [p == "%03d" for p in parts[1::2]]
        # "%d.%03d" (a ts in us from ns // 1000 and ns % 1000): field j's digits and j + 1's, one copy per row
        self.frac = [not f and j + 1 < len(self.fixed) and self.fixed[j + 1] and self.lits[j + 1] == b"."
                     for j, f in enumerate(self.fixed)]

    def __call__(self, cols: np.ndarray) -> Any:
        n = len(cols)
        if n == 0:
            return b""
        if n >= _SMALL:
            top, low = _extremes(cols)
        # compact: a column of one value is text of the template whatever it is (-1: a ParentId of no parent)
        if n < _SMALL or any(lo < 0 or f and t >= 1000 for f, t, lo in zip(self.fixed, top, low)
                             if not self.compact or t != lo):
            return ((self.line * n) % tuple(cols.ravel().tolist())).encode("ascii")
        cuts = _width_cuts(cols, self.fixed, top, low) if self.compact else []
        if cuts:            # pieces in which no value is padded (a SeqNum past 9, 99, ...), else cut byte by byte
            return b"".join(self(cols[a:b]) for a, b in zip([0] + cuts, cuts + [n]))
        # A column of one value (the pid, often channel, peer, size) is text of the row template: its width is
        # its own, so nothing is padded, and no digits are computed for it per row.
        row, fields = bytearray(), []          # (column, offset, width, %03d, min, with .%03d from column + 1)
        lits, fixed, frac, j = self.lits, self.fixed, self.frac, 0
        while j < len(fixed):
            row += lits[j]
            f, t, lo = fixed[j], top[j], low[j]
            if t == lo:
                row += b"%03d" % t if f else b"%d" % t
                j += 1
                continue
            w, sub = 3 if f else len(str(t)), 0
            if not f and lo >= 10000:       # leading digits every row shares (a clock's, an id's): template text
                m = 4
                while t // 10 ** m != lo // 10 ** m:
                    m += 4
                if m < w:                   # the rows' other digits, zero-filled: fewer 4-digit groups per row
                    row += b"%d" % (lo // 10 ** m)
                    w, sub = m, lo // 10 ** m * 10 ** m
            both = frac[j] and top[j + 1] != low[j + 1]
            fields.append((j, len(row), w, not f and not sub, lo, both, sub))
            row += b" " * (w + 4 if both else w)
            j += 2 if both else 1
        row += lits[-1]
        buf = np.empty((n, len(row)), np.uint8)
        _put(buf, 0, np.frombuffer(bytes(row), np.uint8)[None, :])
        end = 0                                 # the previous field's end: bytes before it are the template's
        for j, p, w, pad, lo, both, sub in fields:
            v = cols[:, j] - sub if sub else cols[:, j]
            out, head, o = _words(buf, p, w + 4 * both, row, end)
            _digits(v, w, out, pad, lo, cols[:, j + 1] if both else None, head)
            if o is not None:                   # a scratch array: its digits into the row
                _put(buf, p, out.view(np.uint8)[:, o:])
            end = p + w + 4 * both
        if self.compact and cuts is None:
            keep = np.ones(buf.shape, bool)
            for j, p, w, pad, lo, both, sub in fields:
                if pad:
                    np.not_equal(buf[:, p:p + w], 32, out=keep[:, p:p + w])
            return memoryview(buf[keep])
        return memoryview(buf).cast("B")


def _put(buf: np.ndarray, p: int, d: np.ndarray) -> None:
    """buf[:, p:p + w] = d ((n or 1, w) bytes, each row contiguous), copied as one w-byte item per row: a byte
    block copies row by row, a call each (~100 instructions), where items copy in one loop (~60 each)."""
    w = d.shape[1]
    buf[:, p:p + w].view(f"V{w}")[...] = d.view(f"V{w}")


def _width_cuts(cols: np.ndarray, fixed: list[bool], top: list[int], low: list[int]) -> list[int] | None:
    """Rows of a compact block (no negative value varies) where the digit count of a %d column changes: pieces
    cut there have nothing to pad. None when they would be many (a piece under _SMALL rows is formatted by `%`)."""
    wide = [j for j, (f, t, lo) in enumerate(zip(fixed, top, low)) if not f and len(str(t)) != len(str(lo))]
    if not wide:
        return []
    d = np.stack([np.searchsorted(_POW10, cols[:, j], side="right") for j in wide], axis=1)
    cuts = (np.flatnonzero((d[1:] != d[:-1]).any(axis=1)) + 1).tolist()
    return cuts if len(cuts) * _SMALL * 4 <= len(cols) else None


_POW10 = np.array([10 ** k for k in range(1, 19)], np.int64)


def _extremes(cols: np.ndarray) -> tuple[list[int], list[int]]:
    """Each column's max and min. Reduced over rows, an (n, 16) block runs a 16-wide inner loop per row (~350
    instructions a row); seen as rows of 64 records, one per 64."""
    n, m = cols.shape
    k = n - n % _SMALL
    wide = cols[:k].reshape(-1, _SMALL * m)
    top = np.maximum.reduce(wide.max(axis=0).reshape(_SMALL, m), axis=0)
    low = np.minimum.reduce(wide.min(axis=0).reshape(_SMALL, m), axis=0)
    if k < n:
        np.maximum(top, cols[k:].max(axis=0), out=top)
        np.minimum(low, cols[k:].min(axis=0), out=low)
    return top.tolist(), low.tolist()


def _words(buf: np.ndarray, p: int, w: int, row: bytearray, end: int) -> tuple[np.ndarray, bytes, int | None]:
    """Where a field of w bytes at row offset p goes: (n, ceil(w / 4)) uint32 words of buf ending at p + w, so that
    digit groups go in as words (one copy per row and field cost a call each, ~20-60 instructions), and the
    o = -w % 4 template bytes before p that the first word also covers (row[p - o:p], for _top), with None. A field
    too close to the row's start or to the previous field (`end`) gets a scratch array, no bytes, and o instead:
    its last w bytes per row are the field's (for _put)."""
    k = -(-w // 4)
    o = 4 * k - w
    if p - o < end:
        return np.empty((len(buf), k), np.uint32), b"", o
    return np.ndarray((len(buf), k), np.uint32, buf, p - o, (buf.shape[1], 4)), bytes(row[p - o:p]), None


_TOPS: dict[tuple[bool, bytes], np.ndarray] = {}


def _top(table: np.ndarray, last: bool, head: bytes) -> np.ndarray:
    """table (_LAST if last else _MID) with the first len(head) bytes of every word set to `head`: the template
    bytes that a field's first word covers (_words)."""
    if not head:
        return table
    t = _TOPS.get((last, head))
    if t is None:
        t = table.copy()
        t.view(np.uint8).reshape(-1, 4)[:, :len(head)] = np.frombuffer(head, np.uint8)
        if len(_TOPS) < 64:             # 80 KB each; a few (table, head) pairs per template
            _TOPS[(last, head)] = t
    return t


def _digits(v: np.ndarray, w: int, out: np.ndarray, pad: bool = True, lo: int = 0, frac: np.ndarray | None = None,
            head: bytes = b"") -> None:
    """The ASCII digits of non-negative v < 10**w, right-aligned in 4-byte groups, into out's (n, ceil(w / 4)) uint32
    words; with pad, leading zeros (not the last digit) become spaces. lo: at most min(v) (a group that every value
    has digits above is never blank). frac (values 0..999): one more word per row, "." and its frac in 3 digits.
    head: the first bytes of each row's first word (_words), kept."""
    k = -(-w // 4)
    if frac is not None:
        out[:, k] = _DOT[frac]
    x = v
    for c in range(k - 1, 0, -1):
        q = x // 10000
        r = x - q * 10000            # x % 10000 costs ~3x the instructions of this
        if pad and lo < 10 ** (4 * (k - c)):    # no digit above this group in some rows: blank leading zeros
            r += 10000 * (q == 0)
        out[:, c] = (_LAST if c == k - 1 else _MID)[r]
        x = q
    out[:, 0] = _top(_LAST if k == 1 else _MID, k == 1, head)[x + 10000 if pad else x]    # x < 10000: the top group
