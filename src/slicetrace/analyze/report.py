"""Trace files -> answers: which link is slow, who waited on whom, where each rank's time went.

Works on the KernelStep table of analyze.trace (any number of ranks' files merged). Per slice:
wait = ready - wait (credit for a send, data for a receive), transfer = done - ready, where a fused slice (one
primitive's receive and send on a rank, stamped with one done clock) moves from the later of its two readies: on
the GPU both waits run at once, and a send that had room but no data yet is waiting, not moving. With the KernelCh
table (else the Coll events) too, stragglers (analyze.verdicts): per collective (function, SeqNum) seen on every
rank, the rank whose channel programs started last, and how late; each rank's first collective apart, as start-up
skew.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import TraceFormatError
from ..events.abi import fused_pairs, lost_counters, moving_from
from .links import MIN_JUDGED_BYTES, judged_slices, link_rates, slow_links, slow_receive_sides, unnamed_below
from .links_text import render_links
from .skew_text import render_skew, render_waited
from .trace import KERNEL_CH_TABLE, KERNEL_STEP_TABLE
from .verdicts import (blame_by_op, clock_check, first_ops, held_up_totals, noise_rule, none_left_out, op_index,
                       stragglers, unfinished)
from .waited import most_waited, waits_floor

CLOCK_SLACK_NS = 1000       # a receive this far ahead of its send, past the clocks' stated uncertainty, is an offset
RING_RECORDS = ("overrun", "unpaired", "unwritten", "undrained")  # the drain's losses: a KernelStep is one, a KernelCh two
RING_NOTE = "; a ring record is a KernelStep, or a KernelCh's start or stop"


def counter_unit(name: str) -> str:
    """What a counter of the "slicetrace_counters" record counts (README, "slicetrace report")."""
    if name in RING_RECORDS:
        return "ring records"
    if name == "pool_full":             # a short KernelCh batch is counted declined
        return "KernelSteps a plugin's batch did not keep"
    if name.endswith("_ns"):
        return "ns"
    if name.startswith("ops_") or name == "consumer_behind":
        return "ops"
    if name == "plugin_init_failed":
        return "plugins"
    if name.endswith("_PROXY_CTRL") and name.startswith(("plugin_written", "plugin_lost", "plugin_overwritten")):
        return "spans"                  # the example plugin writes a span per ProxyCtrl state
    return "events"


@dataclass
class Report:
    links: list[dict]        # one per (src, dst): bytes, slices, transfer/wait time, bandwidth
    ranks: list[dict]        # one per rank: time waiting for data, for credit, moving data
    waited_on: list[dict]    # receive wait at `rank` attributed to the sender `peer` it waited on, largest first
    slowest: list[dict]      # the slowest slices by transfer bandwidth
    counters: dict
    stragglers: list[dict] = field(default_factory=list)   # per rank: collectives it started last, lateness
    late_ops: list[dict] = field(default_factory=list)     # the collectives with the largest start skew
    slow_links: list[dict] = field(default_factory=list)   # links well below the median link, and on how many channels
    # collectives not seen on every rank, left out of stragglers: {"collectives": n, "lacking": [{rank, collectives}]}
    stragglers_left_out: dict = field(default_factory=lambda: none_left_out())
    no_counters: list[int] = field(default_factory=list)   # ranks present without a counters record (cut short)
    startup: dict | None = None                            # the first collective's skew: start-up, not a straggler
    straggler_rule: dict = field(default_factory=lambda: noise_rule(0, 0.0, 0.0))
    held_up: list[dict] = field(default_factory=list)      # per rank: the waits that lead to it (verdicts.held_up)
    unfinished: list[dict] = field(default_factory=list)   # collectives failed or cut short (verdicts.unfinished)
    clocks: dict = field(default_factory=dict)          # receives ready before their sends had moved (clock_check)
    slow_receive_sides: list[dict] = field(default_factory=list)    # links slow on the receive side only
    links_judged_by: str = "ops"    # or "slices": no op records, like slices in each quarter (links.link_rates)
    link_rule: dict = field(default_factory=dict)   # how the send sides were judged (links.Rates.rule)
    links_below_unnamed: list[dict] = field(default_factory=list)   # far below in the table, not named (why)
    waited_rule: dict = field(default_factory=dict)     # per op, whom the waits led to, against chance (waited.py)
    failures: list[dict] = field(default_factory=list)  # where an op raised, as the traces say (trace.failures)

    def to_dict(self) -> dict:
        return {"links": self.links, "ranks": self.ranks, "waited_on": self.waited_on, "slowest": self.slowest,
                "counters": self.counters, "stragglers": self.stragglers, "late_ops": self.late_ops,
                "slow_links": self.slow_links, "stragglers_left_out": self.stragglers_left_out,
                "ranks_without_counters": self.no_counters, "startup_skew": self.startup,
                "straggler_rule": self.straggler_rule, "held_up": self.held_up, "unfinished": self.unfinished,
                "clocks": self.clocks, "slow_receive_sides": self.slow_receive_sides,
                "links_judged_by": self.links_judged_by, "link_rule": self.link_rule,
                "links_below_unnamed": self.links_below_unnamed, "waited_rule": self.waited_rule,
                "failures": self.failures,
                "counter_units": {k: counter_unit(k) for c in self.counters.values() for k in c}}


def build(ks: np.ndarray, counters: dict | None = None, top: int = 10, chs: np.ndarray | None = None,
          ranks=None, starts: dict | None = None, spans: list | None = None, names: dict | None = None,
          failures: list | None = None, sym: set | None = None) -> Report:
    """ranks: the run's ranks whose files are present (report passes them: a rank whose file holds no KernelCh or
    counters record is still one of them); default, the ranks in ks and chs. starts: trace.op_starts(records);
    spans: trace.coll_spans(records); names: trace.op_names(records), which name the slowest slices' ops;
    failures: trace.failures(records), quoted with the unfinished ops they stopped; sym: trace.symmetric_ops(records),
    whose loads and stores no send -> receive check pairs."""
    if ks.dtype.names is None or "ready_ns" not in ks.dtype.names:
        raise TraceFormatError(f"ks: expected the KernelStep table of slicetrace.analyze.trace.kernel_steps() "
                               f"(fields {list(KERNEL_STEP_TABLE.names)}), got an array of dtype {ks.dtype}")
    if ranks is None:
        ranks = set(ks["rank"].tolist()) | (set(chs["rank"].tolist()) if chs is not None else set())
    ranks = sorted(int(r) for r in ranks)
    wait = (ks["ready_ns"] - ks["wait_ns"]).astype(np.float64)
    r_half, s_half = fused_pairs(ks, ks["rank"], ks["op"], ks["channel"])
    moved = moving_from(ks, pairs=(r_half, s_half))
    xfer = (ks["done_ns"] - moved).astype(np.float64)
    once = np.ones(len(ks), bool)           # a fused slice's time counted once per rank: by its send half
    once[r_half] = False
    send = ks["is_send"] == 1
    judged = judged_slices(ks["size"], xfer)
    links = []
    for src, dst in sorted({(int(r), int(p)) for r, p in zip(ks["rank"][send], ks["peer"][send])}):
        m = send & (ks["rank"] == src) & (ks["peer"] == dst)
        rm = ~send & (ks["rank"] == dst) & (ks["peer"] == src)
        b = int(ks["size"][m].sum())
        busy = _union_ns(moved[m], ks["done_ns"][m])        # channels move at once: their time counted once
        links.append({"src": src, "dst": dst, "bytes": b, "slices": int(m.sum()),
                      "judged_slices": int((m & judged).sum()),
                      "send_transfer_us": float(xfer[m].sum()) / 1e3, "busy_us": busy / 1e3,
                      "send_credit_wait_us": float(wait[m].sum()) / 1e3,      # None: no receive of it recorded
                      "recv_data_wait_us": float(wait[rm].sum()) / 1e3 if rm.any() else None,
                      "gbps": b / busy if busy > 0 else None})
    per_rank = []
    for r in sorted(set(int(x) for x in ks["rank"])):
        m = ks["rank"] == r
        w, x = m & ~send, m & once          # wall time in each state, on any channel or peer (summed, it can
        per_rank.append({"rank": r,         # pass the run's length: channels wait and move at once)
                         "recv_wait_us": _union_ns(ks["wait_ns"][w], ks["ready_ns"][w]) / 1e3,
                         "send_wait_us": _union_ns(ks["wait_ns"][m & send], ks["ready_ns"][m & send]) / 1e3,
                         "transfer_us": _union_ns(moved[x], ks["done_ns"][x]) / 1e3, "slices": int(m.sum()),
                         "copy_us": float(xfer[x].sum()) / 1e3})    # its copies' work, summed over channels
    waited = {}
    for r, p, w in zip(ks["rank"][~send], ks["peer"][~send], wait[~send]):
        waited[(int(r), int(p))] = waited.get((int(r), int(p)), 0.0) + float(w)
    waited_on = [{"rank": r, "peer": p, "wait_us": w / 1e3}
                 for (r, p), w in sorted(waited.items(), key=lambda kv: -kv[1])]
    bw = np.where(judged, ks["size"] / np.maximum(xfer, 1), np.inf)     # latency-bound slices: as the links' check
    bw[~once] = np.inf                      # a fused slice is listed once, by its send (the link it fed)
    order = np.argsort(bw)[:top]
    slowest = [{"rank": int(ks["rank"][i]), "peer": int(ks["peer"][i]), "channel": int(ks["channel"][i]),
                "is_send": bool(ks["is_send"][i]), "step": int(ks["step"][i]), "bytes": int(ks["size"][i]),
                "transfer_us": float(xfer[i]) / 1e3, "gbps": float(bw[i]),
                "func": (names or {}).get((int(ks["rank"][i]), int(ks["op"][i]))),     # None: its op is unknown
                "seq": int(ks["seq_number"][i]) if ks["seq_number"][i] >= 0 else None}
               for i in order if np.isfinite(bw[i])]
    source = "KernelCh"
    if (chs is None or not len(chs)) and spans:     # the mask left KernelCh out: "none to name" was no verdict
        chs, source = _from_colls(spans), "Coll"
    skew = stragglers(chs, top, ranks)
    skew.rule["judged_from"] = source if skew.rule["collectives"] else None
    no_counters = [r for r in ranks if r not in counters] if counters is not None else []
    moving = {r["rank"]: r["copy_us"] for r in per_rank}
    ops = op_index(ks)
    first = first_ops(ks, ops, starts) if len(ks) else np.zeros(0, bool)    # start-up: left out of waits, links
    unc = max([int(c.get("clock_uncertainty_ns", 0) or 0) for c in (counters or {}).values()] + [0])
    rv = ~send & once                       # receives, not halves of fused slices (timed as their send)
    fused = np.zeros(len(ks), bool)
    fused[s_half] = True
    send_rates = link_rates(ks[send], xfer[send], ops[send], 0.25, fused[send], first[send])   # judges both sides
    slow = slow_links(send_rates, moving)
    blame = blame_by_op(ks, ops, starts, first)
    judged_ops = len(np.unique(ops[(ops >= 0) & ~first]))          # keyed ops after each rank's first
    waits_rule = most_waited(blame, judged_ops, len(ranks), waits_floor(skew.rule, ks, ops))
    return Report(links, per_rank, waited_on, slowest, counters or {}, skew.ranks, skew.ops,
                  slow, skew.left_out, no_counters,
                  skew.startup, skew.rule, held_up_totals(blame),
                  unfinished(spans or [], chs, ranks, lacking=source == "Coll", failures=failures or []),
                  clock_check(_fifo_steps(ks, sym), CLOCK_SLACK_NS + unc),
                  slow_receive_sides(ks[rv], xfer[rv], ops[rv], send_rates, slow, moving, first=first[rv]),
                  send_rates.by, send_rates.rule, unnamed_below(links, send_rates, slow), waits_rule, failures or [])


def _fifo_steps(ks: np.ndarray, sym: set | None) -> np.ndarray:
    """ks without the symmetric kernels' records (a load and a store that share a key are different data)."""
    if not sym:
        return ks
    key = ks["rank"].astype(np.int64) << 32 | ks["op"] & 0xFFFFFFFF         # (rank, op) as one int, per record
    return ks[~np.isin(key, [int(r) << 32 | int(o) & 0xFFFFFFFF for r, o in sym
                              if type(r) is int and type(o) is int])]


def _from_colls(spans: list) -> np.ndarray:
    """KernelCh-like rows (one channel per op) from the Coll events that ended: a Coll begins when its rank calls
    the op, so who called last is the straggler; a Coll with no end is left to `unfinished`, as a missing KernelCh."""
    rows = [(r, 0, seq, func[:24], t0, t1) for r, func, seq, t0, t1, *_ in spans if seq >= 0 and t1 >= 0]
    return np.array(rows, KERNEL_CH_TABLE)


def _union_ns(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of the intervals [starts, ends): each adds what it reaches past every earlier-starting
    one."""
    if not len(starts):
        return 0.0
    o = np.argsort(starts, kind="stable")
    s, e = starts[o].astype(np.int64), ends[o].astype(np.int64)
    reach = np.maximum.accumulate(e)
    before = np.concatenate(([np.iinfo(np.int64).min], reach[:-1]))
    return float(np.maximum(0, e - np.maximum(s, before)).sum())


UNBOUNDED_WIDTH = 1 << 20     # columns of a non-terminal console: wider than any line the report prints


def render(rep: Report, console=None) -> None:
    from rich.markup import escape
    from rich.table import Table
    con = console or _console()
    t = Table(title="links (sender side moving: any channel; waits summed over channels; receiver side data wait)")
    for c in ("src->dst", "MiB", "slices", "GB/s", "moving us", "credit wait us", "data wait us"):
        t.add_column(c, justify="right")
    for ln in rep.links:                # exact bytes are in --json; MiB keeps the row within 80 columns
        g = "n/a" if ln["gbps"] is None else f"{ln['gbps']:.2f}"       # None: no transfer time (coarse clock)
        t.add_row(f"{ln['src']}->{ln['dst']}", f"{ln['bytes'] / 2**20:,.1f}", str(ln["slices"]), g,
                  f"{ln['busy_us']:.1f}", f"{ln['send_credit_wait_us']:.1f}", _us(ln["recv_data_wait_us"]))
    con.print(t)
    if any(ln["recv_data_wait_us"] is None for ln in rep.links):
        con.print("data wait us -: no receive of that link recorded (its receiver's file is missing or holds none)")
    sampled = {r: c.get("sampled_out", 0) for r, c in rep.counters.items() if c.get("sampled_out")}
    if sampled:
        con.print(f"KernelStep sampling (SLICETRACE_KERNEL_STEP_SAMPLE_RATE) left slices out on purpose "
                  f"({sum(sampled.values()):,} records): bytes, slices and times count the kept slices only, and a "
                  f"kept half of a fused slice moves from its own ready clock")
    t = Table(title="ranks")
    for c in ("rank", "waiting for data us", "waiting for credit us", "moving data us", "slices"):
        t.add_column(c, justify="right")
    for r in rep.ranks:
        t.add_row(str(r["rank"]), f"{r['recv_wait_us']:.1f}", f"{r['send_wait_us']:.1f}", f"{r['transfer_us']:.1f}",
                  str(r["slices"]))
    con.print(t)
    if not rep.links and not rep.ranks:
        con.print("the trace has no KernelStep events (the event mask lacked KernelStep, 1<<16), so the link and "
                  "rank tables are empty")
    if rep.slowest:                     # build kept the top N (--top)
        t = Table(title=f"the {len(rep.slowest)} slowest slices of {MIN_JUDGED_BYTES} B or more (by transfer GB/s)")
        t.add_column("op", no_wrap=True)          # function and SeqNum, as the straggler lines name ops
        for c in ("rank", "dir", "peer", "ch", "step", "bytes", "transfer us", "GB/s"):
            t.add_column(c, justify="right")
        for sl in rep.slowest:
            t.add_row(_op_name(sl), str(sl["rank"]), "send" if sl["is_send"] else "recv", str(sl["peer"]),
                      str(sl["channel"]), str(sl["step"]), f"{sl['bytes']:,}", f"{sl['transfer_us']:.1f}",
                      f"{sl['gbps']:.3g}")
        con.print(t)
    ck = rep.clocks
    if ck.get("early"):                 # before the verdicts that compare the ranks' clocks
        s, d = ck["link"]
        con.print(f"clocks: {ck['early']:,} of {ck['matched']:,} matched receives had their data before the send "
                  f"moved it (up to {ck['worst_us']:.1f} us, link {s}->{d}): the ranks' clocks disagree, and the "
                  f"straggler and wait verdicts below, which compare them, may name an offset, not a late rank")
    render_skew(rep, con)               # the findings: stragglers first, then whom the waits lead to, links
    for c in rep.unfinished:            # where a failed run stopped, and who came late to it
        late = f"; rank {c['last_rank']} began it {c['late_us']:.1f} us after the first" if c["began"] > 1 else ""
        never = f"; rank(s) {', '.join(map(str, c['not_begun']))} never began it" if c["not_begun"] else ""
        ended = f" (no end on rank(s) {', '.join(map(str, c['never_ended']))})" if c["never_ended"] else ""
        on = ", ".join(map(str, c["ranks"]))
        why = "".join(f"; rank {f['rank']} raised {escape(f['name'])}" for f in c["failures"])   # [..]: no markup
        if not on:                      # judged from Coll events (no KernelCh): they ended where they began
            con.print(f"unfinished: {c['func']} #{c['seq']}{never[1:]}: a rank that died, or whose file was cut "
                      f"short, before it (see the loss counters){late}{why}")
            continue
        con.print(f"unfinished: {c['func']} #{c['seq']} has no channel records on rank(s) {on}{ended}: it failed "
                  f"(a timeout, a peer's error), the run stopped in it, or its records were lost (see the loss "
                  f"counters); stragglers cannot judge it{late}{never}{why}")
    quoted = {(f["rank"], f["message"]) for c in rep.unfinished for f in c["failures"]}
    for f in rep.failures:              # the failures of no op listed above: p2p, a barrier, past the top 3
        if (f["rank"], f["message"]) not in quoted:
            op = "" if f["op"] is None else f" in {f['op']}" + ("" if f["seq"] is None else f" #{f['seq']}")
            con.print(f"failed: rank {f['rank']}{op} raised {escape(f['name'])}")
    render_waited(rep, con)
    render_links(rep, con)            # slow links and receive sides, and why a link far below is not named
    if rep.counters or rep.no_counters:
        lost = {r: lost_counters(c) for r, c in rep.counters.items()}
        cut = {r: "no counters record (file cut short?), its losses unknown" for r in rep.no_counters}
        con.print(f"loss counters: "
                  f"{_per_rank(lost, cut) if any(lost.values()) or cut else 'none, every record delivered'}")
        units = {k: counter_unit(k) for c in lost.values() for k in c}
        if any(u != "events" for u in units.values()):      # the rest count events
            odd = ", ".join(f"{k}: {u}" for k, u in units.items() if u != "events")
            con.print(f"  (counted in events, except {odd}{RING_NOTE if 'ring records' in units.values() else ''})")
        skipped = {r: {k: v for k, v in c.items() if v and k.startswith("ops_")} for r, c in rep.counters.items()}
        if any(skipped.values()):       # left out on purpose (SLICETRACE_PROFILE_OP_SAMPLE_RATE / _MIN_BYTES)
            con.print(f"ops not profiled by the settings: {_per_rank(skipped)}")
        masked = {r: c.get("masked_out", 0) for r, c in rep.counters.items() if c.get("masked_out")}
        if masked:                      # stamped for the engine (KernelCh ends each op) but in no plugin's mask
            con.print(f"records no plugin's mask asked for (masked_out, not lost): "
                      f"{'; '.join(f'rank {r}: {n:,}' for r, n in sorted(masked.items()))}")


def _us(v: float | None) -> str:
    """A time in us for a table, '-' where it is unknown (None)."""
    return "-" if v is None else f"{v:.1f}"


def _op_name(sl: dict) -> str:
    """A slowest slice's op: function and SeqNum, '-' where the trace does not say (no Coll/P2p record)."""
    if sl.get("func") is None:
        return "-" if sl.get("seq") is None else f"#{sl['seq']}"
    return sl["func"] + ("" if sl.get("seq") is None else f" #{sl['seq']}")


def _console(file=None):
    """A rich Console (on file, default stdout) that lets a closed stdout (`report | head`) raise BrokenPipeError,
    which the command line ends quietly with rc 0, where rich's own exits with 1. Written to a file or a pipe, it
    has no width limit: rich's 80 columns there cut the tables' numbers ("1,048,…") and split each finding."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError("stdout closed")

    con = PipeConsole(file=file)
    if not con.is_terminal:             # tables print at their own width (rich never pads them out), findings whole
        con.width = UNBOUNDED_WIDTH
    return con


def _per_rank(counts: dict, said: dict | None = None) -> str:
    """{rank: {counter: n}} (and {rank: text}) -> "rank 0: overrun 2; rank 1: none; rank 2: text"."""
    text = {r: ", ".join(f"{k} {v:,}" for k, v in c.items()) or "none" for r, c in counts.items()}
    text.update(said or {})
    order = sorted(text.items(), key=lambda kv: (type(kv[0]) is not int, kv[0]))
    return "; ".join(f"rank {r}: {t}" for r, t in order)
