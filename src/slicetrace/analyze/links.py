"""Which links are slow, for report: each link's typical GB/s per channel and per op from its slices (sends, or
receives for their own side), and the links far below the median link, pooled and in most ops (without op keys:
in groups of like slices moved at about one time that carry most of its bytes)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .verdicts import beyond_chance, chance_of, fewest_trials

MIN_JUDGED_BYTES = 4096      # slices below this are latency, not bandwidth: not used to judge links


def judged_slices(size: np.ndarray, xfer: np.ndarray) -> np.ndarray:
    """Per slice, whether it can judge a link's bandwidth: latency-bound slices (a few KiB) say nothing of it, and
    0-byte or untimed ones would divide by zero."""
    return (xfer > 0) & (size >= MIN_JUDGED_BYTES)


class Rates(NamedTuple):
    """link_rates' answer: per link its typical GB/s; per channel each link's; per link [groups judged, groups that
    far below, its bytes in them, in the slow ones]; what the groups are ("ops" or "slices"); and `rule`: how many
    ops after the first judged the links (3 or more links moving), how many it takes to name one (fewest_trials),
    `p`, the share of judged (link, op) pairs that were that far below, and `tests`, the links judged in ops."""
    gbps: dict
    ch_gbps: dict
    in_ops: dict
    by: str
    rule: dict


def _typical(sends: np.ndarray, xfer: np.ndarray, *cols: np.ndarray):
    """Per group of send records with equal (src, dst, *cols): its key, its slices' median GB/s and its bytes."""
    if not len(sends):
        return []
    cols = (sends["rank"], sends["peer"]) + cols
    order = np.lexsort(cols[::-1])                          # each group's slices, one block each
    cols = [np.asarray(c)[order] for c in cols]
    new = np.zeros(len(order), bool)
    new[0] = True
    for c in cols:
        new[1:] |= c[1:] != c[:-1]
    starts = np.flatnonzero(new)
    rates = np.split((sends["size"] / xfer)[order], starts[1:])
    nbytes = np.add.reduceat(sends["size"][order].astype(np.float64), starts)
    keys = zip(*(c[starts].tolist() for c in cols))
    return [(k, float(np.median(r)), b) for k, r, b in zip(keys, rates, nbytes.tolist())]


def _groups(recs: np.ndarray, fused: np.ndarray | None) -> np.ndarray:
    """Per record, a key of the slices judged with it where no op says which: those of its size and kind (half of
    a fused slice or not: a ring's reduce or copy and forward moves slower than a plain send of its size) in its
    quarter of the run (by wait clock: a link slow in one stretch is not slow in most, as in ops)."""
    if not len(recs):
        return np.zeros(0, np.int64)
    f = np.zeros(len(recs), np.int64) if fused is None else np.asarray(fused, np.int64)
    t = recs["wait_ns"].astype(np.int64)
    quarter = np.searchsorted(np.quantile(t, [0.25, 0.5, 0.75]), t, side="right")
    _, key = np.unique(np.stack([recs["size"].astype(np.int64), f, quarter]), axis=1, return_inverse=True)
    return np.asarray(key, np.int64).ravel()


def link_rates(recs: np.ndarray, xfer: np.ndarray, ops: np.ndarray | None, below: float,
               fused: np.ndarray | None = None, first: np.ndarray | None = None) -> Rates:
    """For slow_links and slow_receive_sides: records keyed by link as sends are (rank = src, peer = dst), their
    transfer ns and op keys -> Rates, the groups judged in being "ops", or "slices" where no record has an op key
    (a KernelStep-only mask): pooled over the run, a ring's fused sends were judged against plain p2p sends, naming
    healthy links, so the groups of _groups are judged instead (`fused`: per record, whether it is half of a fused
    slice). `first`: per record, whether it is in its rank's first op (verdicts.first_ops), left out as the
    straggler verdict leaves it out: start-up slows whichever link it meets."""
    ok = judged_slices(recs["size"], xfer)
    ops = np.full(len(recs), -1, np.int64) if ops is None else ops
    by = "ops" if (ops[ok] != -1).any() else "slices"
    n_links = len(set(zip(recs["rank"][ok].tolist(), recs["peer"][ok].tolist())))     # start-up's included
    if first is not None:
        ok &= ~first
    recs, xfer, ops = recs[ok], xfer[ok], ops[ok]
    if by == "slices":
        ops = _groups(recs, None if fused is None else fused[ok])
    ch_gbps: dict[int, dict[tuple[int, int], float]] = {}
    lk: dict[tuple[int, int], list[float]] = {}             # link -> [bytes, time at the typical rates]
    for (src, dst, c), g, b in _typical(recs, xfer, recs["channel"]):
        ch_gbps.setdefault(c, {})[(src, dst)] = g
        acc = lk.setdefault((src, dst), [0.0, 0.0])
        acc[0] += b
        acc[1] += b / g
    gbps = {k: b / t for k, (b, t) in lk.items() if t > 0}
    in_ops: dict[tuple[int, int], list] = {}     # link -> [groups judged, that far below, bytes in them, in those]
    if len(gbps) < 3:
        return Rates(gbps, ch_gbps, in_ops, by, _rule(by, 0, n_links, in_ops))
    per_op: dict[int, dict[tuple[int, int], list[float]]] = {}
    for (src, dst, _, k), g, b in _typical(recs, xfer, recs["channel"], ops):
        if k != -1:
            acc = per_op.setdefault(k, {}).setdefault((src, dst), [0.0, 0.0])
            acc[0] += b
            acc[1] += b / g
    judged = 0
    for links in per_op.values():
        rates = {k: b / t for k, (b, t) in links.items() if t > 0}
        if len(rates) >= 3:
            judged += 1
            m = float(np.median(list(rates.values())))
            for k, g in rates.items():
                slow = g < (1 - below) * m
                n = in_ops.setdefault(k, [0, 0, 0.0, 0.0])
                n[0] += 1
                n[1] += slow
                n[2] += links[k][0]
                n[3] += links[k][0] * slow
    return Rates(gbps, ch_gbps, in_ops, by, _rule(by, judged, n_links, in_ops))


def _rule(by: str, judged: int, n_links: int, in_ops: dict) -> dict:
    """Rates.rule: a link is named when that far below in more of its ops than chance explains, as the straggler
    verdict names a rank (verdicts.beyond_chance): `p`, the odds of a link in an op being so, is the share of the
    judged (link, op) pairs that were; `needed`, the ops after the first it takes a link slow in every one to be
    named (p = 1 / links then, at the least; one test per link); `links`: the links of judged slices, start-up's
    included."""
    pairs = sum(n[0] for n in in_ops.values())
    tests = max(n_links, 3)
    return {"by": by, "ops": judged, "links": n_links, "tests": tests,
            "p": sum(n[1] for n in in_ops.values()) / pairs if pairs else 0.0,
            "needed": fewest_trials(1 / tests, tests) if by == "ops" else None}


def too_few_ops(rule: dict) -> bool:
    """Whether no link could be named for want of ops (Rates.rule), though 3 or more links moved."""
    return rule["by"] == "ops" and rule["links"] >= 3 and (rule["needed"] is None or rule["ops"] < rule["needed"])


def slow_links(rates: Rates, moving: dict | None = None, below: float = 0.25) -> list[dict]:
    """The links whose typical GB/s is more than `below` under the median link's (3 links or more), with the
    channels on which the link is also that far below the channel's median over links: every channel points at
    the link (a degraded NVLink or path), one at that channel's program (its SM, its block). A link's typical
    GB/s on a channel is the median of its slices' (one descheduled slice does not make a link slow); over its
    channels, its bytes over the time they take at those rates. It must also be that far below the median link in
    more than half the ops (verdicts.op_index) after the first where 3 links or more moved, and in more of them
    than chance explains (Rates.rule, `chance`), so a link a little slower all run long by the pooled median
    only is not named, nor one that one op's noise put there (nor one in no such op, e.g. a link of a rank whose
    file was cut short; a trace without op keys is judged so by link_rates' groups of slices, in those that carry
    more than half its bytes, counted as `slice_groups`, `slice_groups_slow`). `sender_outlier`: its sending rank
    moves data longest, 1 / (1 - below) times the median rank's or more (`moving`: rank -> us), so its copies may
    be the slow part; `receiver_outlier` the same of its receiving rank (writes into a lagging rank's buffers are
    slowed too); `sender_other_links`, `sender_other_links_slow`: the sending rank's links to other peers and how
    many of them are that far below too (none: its copies move at the usual rate elsewhere, so the link is it).
    rates: link_rates of the send records (their typical GB/s also judges the receive sides)."""
    gbps = rates.gbps
    if len(gbps) < 3:
        return []
    med = float(np.median(list(gbps.values())))
    longest = _longest(moving, below)

    def others(s: int, d: int) -> tuple[int, int]:      # the sender's links to its other peers: all, slow ones
        o = [g for (a, b), g in gbps.items() if a == s and b != d]
        return len(o), sum(g < (1 - below) * med for g in o)
    return [{**row, "sender_outlier": longest(row["src"]), "receiver_outlier": longest(row["dst"]),
             **dict(zip(("sender_other_links", "sender_other_links_slow"), others(row["src"], row["dst"])))}
            for row in _below_median(rates, below)]


def slow_receive_sides(recvs: np.ndarray, xfer: np.ndarray, ops: np.ndarray | None, send_rates: Rates,
                       slow_sends: list[dict], moving: dict | None = None, below: float = 0.25,
                       first: np.ndarray | None = None) -> list[dict]:
    """A link's receive side judged as slow_links judges send sides: the links whose receives' typical GB/s is
    more than `below` under the median link's receive side (3 links or more), in more than half the ops, while
    slow_links does not name the link's send side (`send_rates`: link_rates of the send records; `slow_sends`:
    slow_links' rows of them; a link named there, or whose send side is not judged, is left to slow_links; one
    slow by the pooled median only is judged here, else it was on neither list). A point-to-point receive moves
    from when its data was there, so a slow one is the receiving rank's copies out of the link (in a ring a
    slow receiver also slows its upstream sender, through credit waits, and slow_links sees it there).
    `receiver_outlier`: the receiving rank moves data longest (as in slow_links); `receiver_other_links`,
    `receiver_other_links_slow`: the receiving rank's receives from its other peers and how many are that far
    below too (all of them: its copies, none: this link's). `send_gbps`, `send_median_gbps`: the link's send side
    and the median link's. recvs, xfer: receive records, not halves of fused slices (their time is the send's),
    their transfer ns; ops: their op keys; first: whether each is in its rank's first op (left out)."""
    send_gbps = send_rates.gbps
    if not len(recvs) or not send_gbps:
        return []
    keyed = recvs.copy()                # keyed by link as a send is: rank = the link's src, peer = its dst
    keyed["rank"], keyed["peer"] = recvs["peer"], recvs["rank"]
    rates = link_rates(keyed, xfer, ops, below, first=first)
    gbps = rates.gbps
    if len(gbps) < 3 or len(send_gbps) < 3:
        return []
    med, send_med = float(np.median(list(gbps.values()))), float(np.median(list(send_gbps.values())))
    longest = _longest(moving, below)
    sends_named = {(r["src"], r["dst"]) for r in slow_sends}

    def others(s: int, d: int) -> tuple[int, int]:      # the receiver's receives from its other peers
        o = [g for (a, b), g in gbps.items() if b == d and a != s]
        return len(o), sum(g < (1 - below) * med for g in o)
    out = []
    for row in _below_median(rates, below):
        sg = send_gbps.get((row["src"], row["dst"]))
        if sg is None or (row["src"], row["dst"]) in sends_named:
            continue
        out.append({**row, "send_gbps": sg, "send_median_gbps": send_med, "receiver_outlier": longest(row["dst"]),
                    **dict(zip(("receiver_other_links", "receiver_other_links_slow"), others(row["src"], row["dst"])))})
    return out


def _below_median(rates: Rates, below: float) -> list[dict]:
    """From link_rates: the links more than `below` under the median link, pooled and in more than half the ops,
    beyond chance (by "slices": in the groups of slices that carry more than half its bytes), slowest first, with
    their channel counts."""
    return [{k: v for k, v in row.items() if k not in ("named", "failed")} for row in judge(rates, below)
            if row["named"]]


def unnamed_below(links: list[dict], rates: Rates, slow: list[dict], below: float = 0.25) -> list[dict]:
    """The links of report's table whose GB/s (bytes over the time they moved) is more than `below` under the
    median link's there (3 links or more), which slow_links (`slow`: its rows) does not name, slowest first, with
    the rule they failed, so the table and the verdict agree: `failed` "too_few_ops" (too_few_ops), "typical" (its
    typical slice is not that far below: a few stalled slices, or the start-up op, pull the table's figure down),
    "ops", "chance", "no_op" (judge's), or "not_judged" (no slice of 4 KiB or more after the first op)."""
    table = {(ln["src"], ln["dst"]): ln["gbps"] for ln in links if ln["gbps"] is not None}
    if len(table) < 3:
        return []
    med = float(np.median(list(table.values())))
    named = {(r["src"], r["dst"]) for r in slow}
    judged = {(r["src"], r["dst"]): r for r in judge(rates, below)}
    typical = float(np.median(list(rates.gbps.values()))) if rates.gbps else None
    out = []
    for k, g in sorted(table.items(), key=lambda kv: kv[1]):
        if g >= (1 - below) * med:
            break
        if k in named:
            continue
        j = judged.get(k, {})
        failed = ("too_few_ops" if too_few_ops(rates.rule) else j.get("failed") or
                  ("typical" if k in rates.gbps else "not_judged"))
        out.append({"src": k[0], "dst": k[1], "gbps": g, "median_gbps": med, "below_pct": 100 * (1 - g / med),
                    "failed": failed, "typical_gbps": rates.gbps.get(k), "typical_median_gbps": typical,
                    "ops": j.get("ops", 0), "ops_slow": j.get("ops_slow", 0), "chance": j.get("chance")})
    return out


def judge(rates: Rates, below: float) -> list[dict]:
    """Every link of rates more than `below` under the median link pooled, slowest first: `named` whether it is
    slow by every rule, else `failed`, the rule it failed: "ops" (not that far below in more than half its ops,
    or its groups' bytes), "chance" (in more, but chance explains as many), "no_op" (in no judged op)."""
    gbps, ch_gbps, in_ops, by, rule = rates
    if len(gbps) < 3:
        return []
    med = float(np.median(list(gbps.values())))
    ch_med = {c: float(np.median(list(v.values()))) for c, v in ch_gbps.items() if len(v) >= 3}
    out = []
    for k, g in sorted(gbps.items(), key=lambda kv: kv[1]):
        if g >= (1 - below) * med:
            break
        n, n_slow, b, b_slow = in_ops.get(k, (0, 0, 0.0, 0.0))
        chance = chance_of(n_slow, n, rule["p"]) if by == "ops" else None
        failed = ("no_op" if not n else "ops" if ((2 * n_slow <= n) if by == "ops" else (2 * b_slow <= b)) else
                  "chance" if by == "ops" and not beyond_chance(n_slow, chance, rule["tests"]) else None)
        n_ops, n_groups = (n, 0) if by == "ops" else (0, n)
        chans = [c for c, v in ch_gbps.items() if k in v and c in ch_med]
        out.append({"src": k[0], "dst": k[1], "gbps": g, "median_gbps": med, "below_pct": 100 * (1 - g / med),
                    "channels": len(chans),
                    "channels_slow": sum(ch_gbps[c][k] < (1 - below) * ch_med[c] for c in chans),
                    "ops": n_ops, "ops_slow": n_slow if n_ops else 0, "chance": chance, "slice_groups": n_groups,
                    "slice_groups_slow": n_slow if n_groups else 0, "named": failed is None, "failed": failed})
    return out


def _longest(moving: dict | None, below: float):
    """rank -> whether it moves data longest, 1 / (1 - below) times the median rank's or more (`moving`: rank ->
    us of copies)."""
    busiest = max(moving.values()) if moving else 0.0
    typical_rank = float(np.median(list(moving.values()))) if moving else 0.0

    def longest(r: int) -> bool:
        t = (moving or {}).get(r, 0.0)
        return bool(t > 0 and t >= busiest and (1 - below) * t > typical_rank)
    return longest
