"""The example plugin's completed Coll and P2p events (sinks/chrome.py), waiting for the trace file.

A stop keeps the event's ints (~2k instructions), where a `%` over its two lines cost ~20k in the drain's poll: the
writer's job formats them a block at a time (chrome_text.RowFormat, compact: the bytes `%` gives each line), with
one template per event's strings (a few per run). An event whose fields the template does not take (not ints in
int64, a negative time, a '%' in a name) is formatted at its stop, as before, and keeps its place.
"""
from __future__ import annotations

import re
from itertools import chain
from typing import Any, Callable

import numpy as np

from .chrome_store import parent_ids
from .chrome_text import COLL_B, OP_E, P2P_B, RowFormat, js

_TEMPLATES = 4096           # templates kept per buffer (a few per run; more: built per event, still right)


class OpRows:
    """One pool's (COLL or P2P) events in stop order: per event its RowFormat and ints, or (None, its two lines).
    len() counts lines (two per event), as the other pools' line lists do."""
    __slots__ = ("ctx", "coll", "fmts", "rows", "_fmt")

    def __init__(self, ctx: Any, coll: bool):         # ctx: chrome_store.Ctx
        self.ctx, self.coll = ctx, coll
        self.fmts: list[RowFormat | None] = []
        self.rows: list[Any] = []
        self._fmt: dict[tuple, RowFormat | None] = {}

    def __len__(self) -> int:
        return 2 * len(self.fmts)

    def add(self, ev: Any, ts1: int) -> bool:
        """Keep the event stopped at ts1 for the block format; False (nothing kept) when it does not fit it."""
        d = ev.descr
        t0, p = d.ts_ns, d.parent
        if self.coll:
            key, a, b, c = (d.func, d.datatype, d.algo, d.proto), d.seq_number, d.count, d.n_channels
        else:
            key, a, b, c = (d.func, d.datatype), d.peer, d.count, d.n_channels
        try:
            fmt = self._fmt[key]
        except KeyError:
            fmt = self._template(key)
        except TypeError:               # an unhashable field
            return False
        # ints (int64 or not: _text), times >= 0: what the templates take as `%` does (else _op_pair's ValueError)
        if fmt is None or not (t0.__class__ is ts1.__class__ is a.__class__ is b.__class__ is c.__class__ is int
                               and t0 >= 0 and ts1 >= 0):
            return False
        pid = parent_ids(p)[0]
        self.fmts.append(fmt)
        self.rows.append((ev.id, t0, a, b, c, pid, ts1))
        return True

    def add_lines(self, lines: list[str]) -> None:
        """An event formatted at its stop (its b and e lines)."""
        self.fmts.append(None)
        self.rows.append(lines)

    def take(self) -> Callable[[], bytes]:
        """The events so far as a job's text (formatted when called); the buffer starts over."""
        fmts, rows = self.fmts, self.rows
        self.fmts, self.rows = [], []
        return lambda: _text(fmts, rows)

    def clear(self) -> None:
        self.fmts, self.rows = [], []

    def _template(self, key: tuple) -> RowFormat | None:
        """The RowFormat of events with these strings: the fields that are the same for every event (strings,
        pid, CommHash, Rank) filled in; None where a field breaks it."""
        ctx = self.ctx
        nm, cat = js(key[0]), "COLL" if self.coll else "P2P"
        try:
            if self.coll:
                b = _fill(COLL_B, (nm, None, ctx.pid, None, None, None, ctx.comm.comm_hash, ctx.rank, None,
                                   js(key[1]), js(key[2]), js(key[3]), None, None))
            else:
                b = _fill(P2P_B, (nm, None, ctx.pid, None, None, ctx.comm.comm_hash, ctx.rank, None, None,
                                  js(key[1]), None, None))
            line = b + _fill(OP_E, (nm, cat, None, ctx.pid, None, None))
        except (TypeError, ValueError):
            line = None
        fmt = None if line is None else RowFormat(line, compact=True)
        if len(self._fmt) < _TEMPLATES:
            self._fmt[key] = fmt
        return fmt


def _fill(line: str, values: tuple) -> str:
    """`line` with the fields whose value is not None filled in (the rest stay for the RowFormat); TypeError where
    `%` would not take a value, ValueError where a filled-in text has a '%' (RowFormat's text has no escapes)."""
    parts = re.split(r"(%03d|%d|%s)", line)
    out = [parts[0]]
    for spec, v, lit in zip(parts[1::2], values, parts[2::2]):
        if v is not None:
            spec = spec % v
            if "%" in spec:
                raise ValueError(spec)
        out += (spec, lit)
    return "".join(out)


def _text(fmts: list, rows: list) -> bytes:
    """The events' lines: each run of one template formatted as a block, the lines of the others as they are."""
    out, i, n = [], 0, len(fmts)
    while i < n:
        f, j = fmts[i], i + 1
        while j < n and fmts[j] is f:
            j += 1
        if f is None:
            out.append("".join(line for pair in rows[i:j] for line in pair).encode("utf-8"))
        else:
            out.append(_block(f, rows[i:j]))
        i = j
    return b"".join(out)


def _block(f: RowFormat, rows: list) -> Any:
    """Lines of events of one template; rows: (id, t0, SeqNum or Peer, Count, nChannels, ParentId, t1)."""
    try:
        r = np.fromiter(chain.from_iterable(rows), np.int64, 7 * len(rows)).reshape(-1, 7)
    except OverflowError:       # an int past int64: `%`, as the other events' lines
        return "".join(f.line % (i, t0 // 1000, t0 % 1000, a, b, c, p, i, t1 // 1000, t1 % 1000)
                       for i, t0, a, b, c, p, t1 in rows).encode("ascii")
    u0, u1 = r[:, 1] // 1000, r[:, 6] // 1000
    return f(np.column_stack([r[:, 0], u0, r[:, 1] - u0 * 1000, r[:, 2], r[:, 3], r[:, 4], r[:, 5], r[:, 0], u1,
                              r[:, 6] - u1 * 1000]))
