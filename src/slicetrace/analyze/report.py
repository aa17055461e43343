"""Trace files -> answers: which link is slow, who waited on whom, where each rank's time went.

Works on the KernelStep table of analyze.trace (any number of ranks' files merged). Per slice:
wait = ready - wait (credit for a send, data for a receive), transfer = done - ready, where a fused slice (one
primitive's receive and send on a rank, stamped with one done clock) moves from the later of its two readies: on
the GPU both waits run at once, and a send that had room but no data yet is waiting, not moving. With the KernelCh
table too,
stragglers: per collective (function, SeqNum) seen on every rank, the rank whose channel programs started last, and
how late.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import TraceFormatError
from ..events.abi import fused_pairs, moving_from


@dataclass
class Report:
    links: list[dict]        # one per (src, dst): bytes, slices, transfer/wait time, bandwidth
    ranks: list[dict]        # one per rank: time waiting for data, for credit, moving data
    waited_on: list[dict]    # receive wait at `rank` attributed to the sender `peer`, largest first
    slowest: list[dict]      # the slowest slices by transfer bandwidth
    counters: dict
    stragglers: list[dict] = field(default_factory=list)   # per rank: collectives it started last, lateness
    late_ops: list[dict] = field(default_factory=list)     # the collectives with the largest start skew
    slow_links: list[dict] = field(default_factory=list)   # links well below the median link, and on how many channels
    # collectives not seen on every rank, left out of stragglers: {"collectives": n, "lacking": [{rank, collectives}]}
    stragglers_left_out: dict = field(default_factory=lambda: none_left_out())
    no_counters: list[int] = field(default_factory=list)   # ranks present without a counters record (cut short)

    def to_dict(self) -> dict:
        return {"links": self.links, "ranks": self.ranks, "waited_on": self.waited_on, "slowest": self.slowest,
                "counters": self.counters, "stragglers": self.stragglers, "late_ops": self.late_ops,
                "slow_links": self.slow_links, "stragglers_left_out": self.stragglers_left_out,
                "ranks_without_counters": self.no_counters}


def none_left_out() -> dict:
    """stragglers()' third result when every collective was judged."""
    return {"collectives": 0, "lacking": []}


def stragglers(chs: np.ndarray, top: int = 10, ranks=None) -> tuple[list[dict], list[dict], dict]:
    """From KernelCh rows: per collective seen on every rank of `ranks` (the run's ranks present; default those in
    chs), 2 or more, each rank's start = its first channel program's start; the last rank is the straggler, late by
    (its start - the earliest). A collective some rank lacks (its file cut short, its Coll records dropped) is left
    out: that rank may be the one that started last. Returns (per rank: times last, total and worst lateness,
    largest first; the `top` collectives with the largest skew; the left out: {"collectives": n, "lacking":
    [{"rank", "collectives"}]})."""
    left_out = none_left_out()
    if len(chs) == 0:
        return [], [], left_out
    want = set(chs["rank"].tolist()) if ranks is None else {int(r) for r in ranks}
    first: dict[tuple[str, int], dict[int, int]] = {}
    for rank, func, seq, t in zip(chs["rank"].tolist(), chs["func"].tolist(), chs["seq_number"].tolist(),
                                  chs["start_ns"].tolist()):
        starts = first.setdefault((func, seq), {})
        if rank not in starts or t < starts[rank]:
            starts[rank] = t
    per_rank: dict[int, dict] = {}
    ops = []
    lacking: dict[int, int] = {}
    for (func, seq), starts in first.items():
        if not want <= starts.keys():
            left_out["collectives"] += 1
            for r in want - starts.keys():
                lacking[r] = lacking.get(r, 0) + 1
            continue
        if len(starts) < 2:
            continue
        last = max(starts, key=lambda r: (starts[r], r))
        late = (starts[last] - min(starts.values())) / 1e3
        ops.append({"func": func, "seq": seq, "rank": last, "late_us": late, "ranks": len(starts)})
        pr = per_rank.setdefault(last, {"rank": last, "times_last": 0, "late_us": 0.0, "worst_us": 0.0})
        pr["times_last"] += 1
        pr["late_us"] += late
        pr["worst_us"] = max(pr["worst_us"], late)
    ops.sort(key=lambda d: -d["late_us"])
    left_out["lacking"] = [{"rank": r, "collectives": n} for r, n in sorted(lacking.items())]
    return sorted(per_rank.values(), key=lambda d: (-d["late_us"], d["rank"])), ops[:top], left_out


def build(ks: np.ndarray, counters: dict | None = None, top: int = 10, chs: np.ndarray | None = None,
          ranks=None) -> Report:
    """ranks: the run's ranks whose files are present (report passes them: a rank whose file holds no KernelCh or
    counters record is still one of them); default, the ranks in ks and chs."""
    if ks.dtype.names is None or "ready_ns" not in ks.dtype.names:
        raise TraceFormatError("expected the KernelStep table of slicetrace.analyze.trace.kernel_steps()")
    if ranks is None:
        ranks = set(ks["rank"].tolist()) | (set(chs["rank"].tolist()) if chs is not None else set())
    ranks = sorted(int(r) for r in ranks)
    wait = (ks["ready_ns"] - ks["wait_ns"]).astype(np.float64)
    r_half, s_half = fused_pairs(ks, ks["rank"], ks["op"], ks["channel"])
    xfer = (ks["done_ns"] - moving_from(ks, pairs=(r_half, s_half))).astype(np.float64)
    once = np.ones(len(ks), bool)           # a fused slice's time counted once per rank: by its send half
    once[r_half] = False
    send = ks["is_send"] == 1
    links = []
    for src, dst in sorted({(int(r), int(p)) for r, p in zip(ks["rank"][send], ks["peer"][send])}):
        m = send & (ks["rank"] == src) & (ks["peer"] == dst)
        rm = ~send & (ks["rank"] == dst) & (ks["peer"] == src)
        b = int(ks["size"][m].sum())
        t = float(xfer[m].sum())
        links.append({"src": src, "dst": dst, "bytes": b, "slices": int(m.sum()),
                      "send_transfer_us": t / 1e3, "send_credit_wait_us": float(wait[m].sum()) / 1e3,
                      "recv_data_wait_us": float(wait[rm].sum()) / 1e3,
                      "gbps": b / t if t > 0 else None})
    per_rank = []
    for r in sorted(set(int(x) for x in ks["rank"])):
        m = ks["rank"] == r
        per_rank.append({"rank": r, "recv_wait_us": float(wait[m & ~send].sum()) / 1e3,
                         "send_wait_us": float(wait[m & send].sum()) / 1e3,
                         "transfer_us": float(xfer[m & once].sum()) / 1e3, "slices": int(m.sum())})
    waited = {}
    for r, p, w in zip(ks["rank"][~send], ks["peer"][~send], wait[~send]):
        waited[(int(r), int(p))] = waited.get((int(r), int(p)), 0.0) + float(w)
    waited_on = [{"rank": r, "peer": p, "wait_us": w / 1e3}
                 for (r, p), w in sorted(waited.items(), key=lambda kv: -kv[1])]
    bw = np.where(xfer > 0, ks["size"] / np.maximum(xfer, 1), np.inf)
    bw[~once] = np.inf                      # a fused slice is listed once, by its send (the link it fed)
    order = np.argsort(bw)[:top]
    slowest = [{"rank": int(ks["rank"][i]), "peer": int(ks["peer"][i]), "channel": int(ks["channel"][i]),
                "is_send": bool(ks["is_send"][i]), "step": int(ks["step"][i]), "bytes": int(ks["size"][i]),
                "transfer_us": float(xfer[i]) / 1e3, "gbps": float(bw[i])} for i in order if np.isfinite(bw[i])]
    late_ranks, late_ops, left_out = stragglers(chs, top, ranks) if chs is not None else ([], [], none_left_out())
    no_counters = [r for r in ranks if r not in counters] if counters is not None else []
    return Report(links, per_rank, waited_on, slowest, counters or {}, late_ranks, late_ops,
                  slow_links(ks[send], xfer[send]), left_out, no_counters)


def slow_links(sends: np.ndarray, xfer: np.ndarray, below: float = 0.25) -> list[dict]:
    """The links whose typical GB/s is more than `below` under the median link's (3 links or more), with the
    channels on which the link is also that far below the channel's median over links: every channel points at
    the link (a degraded NVLink or path), one at that channel's program (its SM, its block). A link's typical
    GB/s on a channel is the median of its slices' (one descheduled slice does not make a link slow); over its
    channels, its bytes over the time they take at those rates. sends, xfer: send records, their transfer ns."""
    ok = xfer > 0
    sends, xfer = sends[ok], xfer[ok]
    keys, inv = np.unique(np.stack([sends["rank"], sends["peer"], sends["channel"]]).astype(np.int64), axis=1,
                          return_inverse=True)
    inv = inv.ravel()
    order = np.argsort(inv, kind="stable")                  # each (link, channel)'s slices, one block each
    rates = np.split((sends["size"] / xfer)[order], np.flatnonzero(np.diff(inv[order])) + 1)
    nbytes = np.bincount(inv, weights=sends["size"].astype(np.float64), minlength=keys.shape[1])
    ch_gbps: dict[int, dict[tuple[int, int], float]] = {}
    lk: dict[tuple[int, int], list[float]] = {}             # link -> [bytes, time at the typical rates]
    for (src, dst, c), r, b in zip(keys.T.tolist(), rates, nbytes.tolist()):
        g = float(np.median(r))
        ch_gbps.setdefault(c, {})[(src, dst)] = g
        acc = lk.setdefault((src, dst), [0.0, 0.0])
        acc[0] += b
        acc[1] += b / g
    gbps = {k: b / t for k, (b, t) in lk.items() if t > 0}
    if len(gbps) < 3:
        return []
    med = float(np.median(list(gbps.values())))
    ch_med = {c: float(np.median(list(v.values()))) for c, v in ch_gbps.items() if len(v) >= 3}
    out = []
    for k, g in sorted(gbps.items(), key=lambda kv: kv[1]):
        if g >= (1 - below) * med:
            break
        chans = [c for c, v in ch_gbps.items() if k in v and c in ch_med]
        out.append({"src": k[0], "dst": k[1], "gbps": g, "median_gbps": med, "below_pct": 100 * (1 - g / med),
                    "channels": len(chans),
                    "channels_slow": sum(ch_gbps[c][k] < (1 - below) * ch_med[c] for c in chans)})
    return out


def render(rep: Report, console=None) -> None:
    from rich.table import Table
    con = console or _console()
    t = Table(title="links (sender side transfer; receiver side wait)")
    for c in ("src->dst", "MiB", "slices", "GB/s", "transfer us", "credit wait us", "data wait us"):
        t.add_column(c, justify="right")
    for ln in rep.links:                # exact bytes are in --json; MiB keeps the row within 80 columns
        g = "n/a" if ln["gbps"] is None else f"{ln['gbps']:.2f}"       # None: no transfer time (coarse clock)
        t.add_row(f"{ln['src']}->{ln['dst']}", f"{ln['bytes'] / 2**20:,.1f}", str(ln["slices"]), g,
                  f"{ln['send_transfer_us']:.1f}", f"{ln['send_credit_wait_us']:.1f}", f"{ln['recv_data_wait_us']:.1f}")
    con.print(t)
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
    if rep.stragglers:
        t = Table(title="stragglers (rank whose channel programs started last, per collective)")
        for c in ("rank", "collectives started last", "total late us", "worst us"):
            t.add_column(c, justify="right")
        for r in rep.stragglers:
            t.add_row(str(r["rank"]), str(r["times_last"]), f"{r['late_us']:.1f}", f"{r['worst_us']:.1f}")
        con.print(t)
    if rep.late_ops:                    # build kept the top N (--top 0: none)
        w = rep.late_ops[0]
        con.print(f"largest skew: {w['func']} #{w['seq']}, rank {w['rank']} started {w['late_us']:.1f} us after the "
                  f"first of {w['ranks']} ranks")
    if rep.slowest:                     # build kept the top N (--top)
        t = Table(title=f"the {len(rep.slowest)} slowest slices (by transfer GB/s)")
        for c in ("rank", "dir", "peer", "ch", "step", "bytes", "transfer us", "GB/s"):
            t.add_column(c, justify="right")
        for sl in rep.slowest:
            t.add_row(str(sl["rank"]), "send" if sl["is_send"] else "recv", str(sl["peer"]), str(sl["channel"]),
                      str(sl["step"]), f"{sl['bytes']:,}", f"{sl['transfer_us']:.1f}", f"{sl['gbps']:.3g}")
        con.print(t)
    for ln in rep.slow_links:
        con.print(f"slow link: {ln['src']}->{ln['dst']} moves {ln['gbps']:.2f} GB/s (typical slice), "
                  f"{ln['below_pct']:.0f} % below the median link ({ln['median_gbps']:.2f}); that far below the "
                  f"other links on {ln['channels_slow']} of {ln['channels']} channels")
    if 0 < len(rep.links) < 3:
        con.print(f"slow links: not judged, {len(rep.links)} link(s) in this trace and the check compares each with "
                  f"the median of 3 or more")
    gone = rep.stragglers_left_out
    if gone["collectives"]:             # a rank without the records may be the straggler: no confident wrong name
        who = "; ".join(f"rank {d['rank']} lacked {d['collectives']}" for d in gone["lacking"])
        con.print(f"stragglers: {gone['collectives']} collective(s) left out, not recorded on every rank ({who}; "
                  f"their KernelCh or Coll records are missing: a file cut short, or records dropped, see the loss "
                  f"counters): the rank that started them last may be one that lacks them"
                  + (", so the table counts the other collectives only" if rep.stragglers else ""))
    elif rep.links and not rep.stragglers and not rep.late_ops:
        con.print("stragglers: none to name (matched across ranks by a collective's SeqNum, from KernelCh events; "
                  "point-to-point ops carry none: see who waited on whom)")
    if rep.waited_on:
        w = rep.waited_on[0]
        con.print(f"most waited on: rank {w['rank']} waited {w['wait_us']:.1f} us for data from rank {w['peer']}")
    if rep.counters or rep.no_counters:
        lost = {r: {k: v for k, v in c.items() if v and k != "sampled_out"
                    and not k.startswith(("delivered", "plugin_written", "clock_", "ops_"))}
                for r, c in rep.counters.items()}
        cut = {r: "no counters record (file cut short?), its losses unknown" for r in rep.no_counters}
        con.print(f"loss counters: "
                  f"{_per_rank(lost, cut) if any(lost.values()) or cut else 'none, every record delivered'}")
        skipped = {r: {k: v for k, v in c.items() if v and k.startswith("ops_")} for r, c in rep.counters.items()}
        if any(skipped.values()):       # left out on purpose (SLICETRACE_PROFILE_OP_SAMPLE_RATE / _MIN_BYTES)
            con.print(f"ops not profiled by the settings: {_per_rank(skipped)}")


def _console():
    """A rich Console that lets a closed stdout (`report | head`) raise BrokenPipeError, which the command line
    ends quietly with rc 0, where rich's own exits with 1."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError("stdout closed")

    return PipeConsole()


def _per_rank(counts: dict, said: dict | None = None) -> str:
    """{rank: {counter: n}} (and {rank: text}) -> "rank 0: overrun 2; rank 1: none; rank 2: text"."""
    text = {r: ", ".join(f"{k} {v:,}" for k, v in c.items()) or "none" for r, c in counts.items()}
    text.update(said or {})
    order = sorted(text.items(), key=lambda kv: (type(kv[0]) is not int, kv[0]))
    return "; ".join(f"rank {r}: {t}" for r, t in order)
