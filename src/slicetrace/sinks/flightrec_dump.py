"""The flight recorder's trace (sinks/flightrec.py): its kept ops replayed into the example plugin.

The example plugin writes the file, so the flight record is its trace exactly (records, ids, ERROR instants, the
process renamed "failed: <Error>", the counters record), with one more record after slicetrace_comm:
"slicetrace_flightrec" (ph M), whose args say what the file holds: Trigger (failure, unfinished or always), the
window (FirstOp/LastOp: the ops' places among the Coll/P2p events the recorder saw, from 1; FirstSeqNum/LastSeqNum:
per collective function, the SeqNums kept; EvictedSeqNum: per function, the last SeqNum evicted: an unfinished op
kept from before it leaves the window with a gap), OpsKept, OpsInFlight, RecordsKept, what went before it
(OpsEvicted, RecordsEvicted), the earlier writes that failed (WritesFailed), the limits (MaxOps, MaxRecords), and
per unfinished op how far each connection got (Unfinished).
An op still in flight ends at the dump's time; one that ended unfinished carries the example plugin's mark
(args.UnfinishedKernelCh on its "e" record). The file is written under a hidden name and renamed when whole: a
reader never meets half a dump, and a later dump replaces an earlier one.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..events.abi import ActivationMask, CollDescr
from .chrome import DEFAULT_MASK, ChromePlugin

WINDOW_RECORD = "slicetrace_flightrec"


def dump(ctx: Any, why: str, ts_ns: int | None) -> str:
    """Write ctx's (flightrec.Ctx) ops as `<prefix>_<commHash>_<rank>.json`; returns its path. OSError if it cannot."""
    head, base = os.path.split(ctx.prefix)
    cp = ChromePlugin(ctx.settings.with_(profile_dump_file=os.path.join(head, f".{base}.partial{os.getpid()}"),
                                         profile_event_mask=DEFAULT_MASK))
    try:
        cc = cp.init(ctx.comm, ActivationMask())
    except ConfigError as e:            # its message names the example plugin's variable, not ours
        raise OSError(f"cannot create {ctx.prefix}'s file: {e.__cause__ or e}") from e
    tmp = cc.path
    final = f"{ctx.prefix}_{ctx.comm.comm_hash}_{ctx.comm.rank}.json"
    try:
        ops = ctx.kept()
        cc.write(json.dumps({"name": WINDOW_RECORD, "ph": "M", "pid": cc.pid, "tid": 0,
                             "args": window(ctx, ops, why)}, separators=(",", ":")) + ",\n")
        end = time.monotonic_ns() if ts_ns is None else ts_ns
        for op in ops:
            h = cp.start_event(cc, op.descr)
            for recs, a, b in op.chans:
                cp.kernel_ch_batch(cc, h, recs[a:b])
            for recs, a, b in op.steps:
                cp.kernel_step_batch(cc, h, recs[a:b])
            if op.unfinished and h is not None:     # its e record says so, as in the example plugin's trace
                cp.event_unfinished(h, op.unfinished)
            cp.stop_event(h, op.t1 if op.t1 is not None else max(end, _last_ns(op)))
        for f in ctx.failures:
            cp.comm_failed(cc, f)
        cp.report_counters(cc, ctx.counters())
        cp.finalize(cc)
        os.replace(tmp, final)
    except BaseException:
        cp.finalize(cc)                 # a no-op once it ran: its writer thread ends, its file is closed
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return final


def window(ctx: Any, ops: list, why: str) -> dict:
    """The slicetrace_flightrec record's args (the module's doc)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for op in ops:
        d = op.descr
        if d.__class__ is CollDescr:
            first[d.func] = min(first.get(d.func, d.seq_number), d.seq_number)
            last[d.func] = max(last.get(d.func, d.seq_number), d.seq_number)
    return {"Trigger": why, "MaxOps": ctx.max_ops, "MaxRecords": ctx.max_records, "OpsSeen": ctx.ops,
            "FirstOp": ops[0].index if ops else None, "LastOp": ops[-1].index if ops else None,
            "FirstSeqNum": first, "LastSeqNum": last, "EvictedSeqNum": dict(ctx.evicted_seq), "OpsKept": len(ops),
            "OpsInFlight": sum(op.t1 is None for op in ops), "RecordsKept": ctx.records,
            "OpsEvicted": ctx.evicted_ops, "RecordsEvicted": ctx.evicted_records, "WritesFailed": ctx.failed_writes,
            "Unfinished": [unfinished(op) for op in ops if op.unfinished or op.t1 is None]}


def unfinished(op: Any) -> dict:
    """An op that did not finish: what it is, and per connection (channel, direction, peer) the last FIFO step of
    its KernelSteps kept and how many there are: where it stalled."""
    d = op.descr
    out: dict[str, Any] = {"Op": d.func, "OpIndex": op.index, "InFlight": op.t1 is None}
    if d.__class__ is CollDescr:
        out["SeqNum"] = d.seq_number
    else:
        out["ToPeer"] = d.peer
    conns = []
    if op.steps:
        ch, snd, peer, step = (np.concatenate([r[f][a:b] for r, a, b in op.steps]).astype(np.int64)
                               for f in ("channel", "is_send", "peer", "step"))
        key = (ch << 32) | (snd << 31) | peer
        for k in np.unique(key).tolist():
            m = key == k
            conns.append({"Channel": k >> 32, "IsSend": (k >> 31) & 1, "Peer": k & 0x7FFFFFFF,
                          "LastStep": int(step[m].max()), "Slices": int(m.sum())})
    out["Connections"] = conns
    return out


def _last_ns(op: Any) -> int:
    """The latest end among an op's records (an op in flight must end after them)."""
    ends = ([int(r["stop_ns"][a:b].max()) for r, a, b in op.chans if b > a]
            + [int(r["done_ns"][a:b].max()) for r, a, b in op.steps if b > a])
    return max(ends, default=0)
