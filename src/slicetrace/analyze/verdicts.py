"""The report's verdicts: which rank starts collectives late (stragglers), and whose slowness the waits lead to.

Ranks' clocks are one host's CLOCK_MONOTONIC (the trace's host timeline), so one rank's wait can be laid against
another's. Each rank's first op is judged apart: its start skew is the processes' start-up, not a straggler.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SPREAD_X = 3.0          # a straggler's lead must beat 3x the other ranks' typical start spread ...
OP_FRACTION = 0.5       # ... and half the typical op (2 ranks have no spread; a ring's exit skew is ~1 slice)
ALPHA = 0.01            # odds of naming a straggler in a run without one (every collective's late rank by chance)


@dataclass
class Skew:
    ranks: list[dict]       # per rank that started a judged collective last, most consistent first
    ops: list[dict]         # the judged collectives with the largest start skew
    left_out: dict          # collectives not recorded on every rank: {"collectives": n, "lacking": [...]}
    startup: dict | None    # the first collective: its skew is start-up, left out of ranks and ops
    rule: dict              # the noise floor the verdict used


def none_left_out() -> dict:
    """stragglers()' left_out when every collective was judged."""
    return {"collectives": 0, "lacking": []}


def noise_rule(judged: int, spread_us: float, op_us: float) -> dict:
    """The straggler floor from `judged` collectives' median spread of the other ranks' starts and median op."""
    return {"collectives": judged, "others_spread_us": spread_us, "op_us": op_us,
            "floor_us": max(SPREAD_X * spread_us, OP_FRACTION * op_us)}


def stragglers(chs: np.ndarray | None, top: int = 10, ranks=None) -> Skew:
    """From KernelCh rows: per collective (function, SeqNum) seen on every rank of `ranks` (default those in chs),
    2 or more, each rank's start = its first channel program's start, the last rank late by (its start - the
    earliest). A collective some rank lacks is left out: that rank may be the one that started last. Each rank's
    first collective is left out too and returned as `startup`. A judged collective counts against its last rank
    as `times_late` when that rank started more than the floor after every other rank: the floor is the larger of
    SPREAD_X x the median spread of the other ranks' starts and OP_FRACTION x the median op time (the last rank's
    own span). `consistent`: late so in 2 or more collectives, and more often than chance explains, overall or in
    one function's: `chance` = the odds that a rank picked at random per collective is late as often (binomial),
    which must be at most ALPHA over the tests made (ranks x (functions + 1))."""
    left_out = none_left_out()
    if chs is None or len(chs) == 0:
        return Skew([], [], left_out, None, noise_rule(0, 0.0, 0.0))
    want = set(chs["rank"].tolist()) if ranks is None else {int(r) for r in ranks}
    span: dict[tuple[str, int], dict[int, list[int]]] = {}
    for rank, func, seq, t0, t1 in zip(chs["rank"].tolist(), chs["func"].tolist(), chs["seq_number"].tolist(),
                                       chs["start_ns"].tolist(), chs["stop_ns"].tolist()):
        s = span.setdefault((func, seq), {}).setdefault(rank, [t0, t1])
        s[0], s[1] = min(s[0], t0), max(s[1], t1)
    firsts = {min((sp[r][0], key) for key, sp in span.items() if r in sp)[1] for r in want
              if any(r in sp for sp in span.values())}
    judged, lacking, startup = [], {}, None
    for key, sp in sorted(span.items(), key=lambda kv: min(v[0] for v in kv[1].values())):
        if not want <= sp.keys():
            left_out["collectives"] += 1
            for r in want - sp.keys():
                lacking[r] = lacking.get(r, 0) + 1
            continue
        if len(sp) < 2:
            continue
        order = sorted((v[0], r) for r, v in sp.items())       # ties: the higher rank is last
        (t_first, _), (t_next, _), (t_last, last) = order[0], order[-2], order[-1]
        op = {"func": key[0], "seq": key[1], "rank": last, "late_us": (t_last - t_first) / 1e3, "ranks": len(sp)}
        if key in firsts:
            startup = startup or op                             # the earliest, when ranks' firsts differ
            continue
        judged.append((op, (t_last - t_next) / 1e3, (t_next - t_first) / 1e3, (sp[last][1] - t_last) / 1e3))
    left_out["lacking"] = [{"rank": r, "collectives": n} for r, n in sorted(lacking.items())]
    if not judged:
        return Skew([], [], left_out, startup, noise_rule(0, 0.0, 0.0))
    rule = noise_rule(len(judged), float(np.median([j[2] for j in judged])), float(np.median([j[3] for j in judged])))
    per_func: dict[str, int] = {}
    per_rank: dict[int, dict] = {}
    for op, lead, _, _ in judged:
        per_func[op["func"]] = per_func.get(op["func"], 0) + 1
        pr = per_rank.setdefault(op["rank"], {"rank": op["rank"], "times_last": 0, "times_late": 0, "late_us": 0.0,
                                              "median_late_us": 0.0, "worst_us": 0.0, "consistent": False,
                                              "chance": 1.0,
                                              "_late": [], "_funcs": {}})
        pr["times_last"] += 1
        pr["late_us"] += op["late_us"]
        pr["worst_us"] = max(pr["worst_us"], op["late_us"])
        pr["_late"].append(op["late_us"])
        if lead > rule["floor_us"]:
            pr["times_late"] += 1
            pr["_funcs"][op["func"]] = pr["_funcs"].get(op["func"], 0) + 1
    # out of every judged collective, not only the late ones: healthy runs are late in streaks (a ring's exit skew
    # repeats for a block of ops; 2 ranks have no spread in their floor), which over the late ones alone named a
    # straggler in 7 of 9 healthy 2-rank runs on the CI host (all judged: 1 of 9)
    p, tests = 1 / max(len(want), 2), max(len(want), 2) * (len(per_func) + 1)
    rule["late_collectives"] = sum(pr["times_late"] for pr in per_rank.values())
    for pr in per_rank.values():
        pr["median_late_us"] = float(np.median(pr.pop("_late")))
        funcs = pr.pop("_funcs")
        pr["chance"] = min([chance_of(pr["times_late"], len(judged), p)]
                           + [chance_of(n, per_func[f], p) for f, n in funcs.items()])
        pr["consistent"] = beyond_chance(pr["times_late"], pr["chance"], tests)
    ops = sorted((j[0] for j in judged), key=lambda d: -d["late_us"])[:top]
    ranked = sorted(per_rank.values(), key=lambda d: (-d["times_late"], -d["times_last"], -d["median_late_us"],
                                                      d["rank"]))
    return Skew(ranked, ops, left_out, startup, rule)


def unfinished(spans: list[tuple], chs: np.ndarray | None, ranks, top: int = 3, lacking: bool = False,
               failures: list[dict] = ()) -> list[dict]:
    """Collectives with a Coll event but, on some rank, no channel record or no end: an op that failed (a timeout,
    a peer's error: its KernelCh never came), never ended (a crash, a file cut short) or whose records were lost.
    The straggler verdict, which reads KernelCh, cannot judge them; their Coll begins still say who came late to
    the op a failed run stopped in. From trace.coll_spans; earliest first. None when the trace has no KernelCh.
    lacking (chs made from the Coll events, no KernelCh recorded): also those a rank with Coll events has no begin of
    (where it stopped; a rank with none says nothing of where). failures (trace.failures): each row's `failures`
    are those its ranks' traces say the op raised (rank, name, error, message), matched by (communicator, op, seq):
    spans' sixth field and the failures' comm, where both are known (two communicators' ops share names and seqs)."""
    if chs is None or not len(chs):
        return []
    have = set(zip(chs["rank"].tolist(), chs["func"].tolist(), chs["seq_number"].tolist()))
    by: dict[tuple[str | None, str, int], dict[int, tuple[int, int]]] = {}
    for rank, func, seq, t0, t1, *comm in spans:
        if seq >= 0:
            by.setdefault((comm[0] if comm else None, func, seq), {})[rank] = (t0, t1)
    out, seen = [], {r for r, *_ in spans}
    for (comm, func, seq), sp in sorted(by.items(), key=lambda kv: min(v[0] for v in kv[1].values())):
        short = sorted(r for r, (_, t1) in sp.items() if t1 < 0 or (r, func, seq) not in have)
        if not short and not (lacking and (set(ranks) & seen) - sp.keys()):
            continue
        t_first = min(t0 for t0, _ in sp.values())
        t_last, last = max((t0, r) for r, (t0, _) in sp.items())
        out.append({"func": func, "seq": seq, "ranks": short, "never_ended": [r for r in short if sp[r][1] < 0],
                    "not_begun": sorted(set(ranks) - sp.keys()), "last_rank": last,
                    "late_us": (t_last - t_first) / 1e3, "began": len(sp),
                    "failures": [{k: f[k] for k in ("rank", "name", "error", "message")} for f in failures
                                 if (f["op"], f["seq"]) == (func, seq)
                                 and (None in (comm, f.get("comm")) or f.get("comm") == comm)]})
        if len(out) == top:
            break
    return out


def beyond_chance(hits: int, chance: float, tests: int) -> bool:
    """The rule of every verdict that names a rank or link for what it did in many ops: 2 hits or more, and odds
    `chance` of as many by chance (chance_of) of at most ALPHA over the `tests` made (one per candidate judged)."""
    return hits >= 2 and chance * tests <= ALPHA


def fewest_trials(p: float, tests: int, most: int = 1000) -> int | None:
    """The fewest trials in which a candidate hit in every one is beyond_chance (None: more than `most`)."""
    return next((n for n in range(2, most + 1) if beyond_chance(n, chance_of(n, n, p), tests)), None)


def chance_of(k: int, n: int, p: float) -> float:
    """The odds that a candidate hit with probability p in each of n trials is hit k times or more: P(X >= k) for
    X ~ Binomial(n, p); 1.0 for k at or below the mean (never named then)."""
    if k <= n * p:
        return 1.0
    if p <= 0:                              # never hit by chance: k > 0 hits are none of its doing
        return 0.0
    lq, lp, total = math.log1p(-p), math.log(p), 0.0
    for i in range(k, n + 1):               # terms fall past the mean: stop once they no longer count
        term = math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
        total += term
        if term <= total * 1e-17:
            break
    return min(1.0, total)


def op_index(ks: np.ndarray) -> np.ndarray:
    """Per KernelStep row, a key naming its op alike on every rank (-1 without a parent op): the op's SeqNum and
    how many of the rank's earlier ops had that SeqNum. Coll ids differ per rank, and SeqNum counts per function;
    a communicator's ranks run its collectives in one order."""
    out = np.full(len(ks), -1, np.int64)
    idx = np.flatnonzero(ks["op"] != -1)
    if not len(idx):
        return out
    r, o = ks["rank"][idx].astype(np.int64), ks["op"][idx]
    order = np.lexsort((ks["wait_ns"][idx], o, r))      # by rank and op, each op's earliest record first
    new = np.concatenate(([True], (np.diff(r[order]) != 0) | (np.diff(o[order]) != 0)))
    head = order[new]                                   # each (rank, op)'s earliest record
    seen: dict[tuple[int, int], int] = {}
    names: dict[tuple[int, int], int] = {}
    key = np.empty(len(head), np.int64)
    rk, sq, first = r[head].tolist(), ks["seq_number"][idx][head].tolist(), ks["wait_ns"][idx][head]
    for i in np.lexsort((first, r[head])).tolist():     # each rank's ops in time order
        n = seen.get((rk[i], sq[i]), 0)
        seen[(rk[i], sq[i])] = n + 1
        key[i] = names.setdefault((sq[i], n), len(names))
    out[idx[order]] = key[np.cumsum(new) - 1]
    return out


def _waits(ks: np.ndarray) -> dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(rank, channel, is_send) -> (starts, ends, peers) of that rank's waits there (is_send 0: for data, 1: for
    credit), in time order and cut to be disjoint."""
    m = ks["ready_ns"] > ks["wait_ns"]
    if not m.any():
        return {}
    s, e, p = ks["wait_ns"][m].astype(np.int64), ks["ready_ns"][m].astype(np.int64), ks["peer"][m]
    key = np.stack([ks["rank"][m], ks["channel"][m], ks["is_send"][m]]).astype(np.int64)
    order = np.lexsort((s, key[2], key[1], key[0]))
    key, s, e, p = key[:, order], s[order], e[order], p[order]
    cuts = np.flatnonzero(np.any(np.diff(key, axis=1) != 0, axis=0)) + 1
    out = {}
    for lo, hi in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(s)])).tolist()):
        bs, be = s[lo:hi], e[lo:hi]
        covered = np.maximum.accumulate(be)
        bs = np.maximum(bs, np.concatenate(([bs[0]], covered[:-1])))
        keep = be > bs
        out[tuple(key[:, lo].tolist())] = (bs[keep], be[keep], p[lo:hi][keep])
    return out


def first_ops(ks: np.ndarray, key: np.ndarray, starts: dict | None = None) -> np.ndarray:
    """Per record, whether it is in its rank's first op: with the ops' begins (trace.op_starts), every part of a
    p2p group (each has a key of its own, all one begin; an op whose begin is missing, e.g. a file cut short, is
    not first); without, the first key's. Records without op keys (no Coll/P2p records) before the rank's first
    keyed one are first when they began before every rank had begun."""
    first = np.zeros(len(ks), bool)
    ranks = np.unique(ks["rank"]).tolist()
    all_in = max(int(ks["wait_ns"][ks["rank"] == r].min()) for r in ranks)
    for r in ranks:
        mine = np.flatnonzero(ks["rank"] == r)
        keyed = mine[key[mine] != -1]
        bare = mine[key[mine] == -1]
        t_keyed = int(ks["wait_ns"][keyed].min()) if len(keyed) else None
        if len(bare) and (t_keyed is None or int(ks["wait_ns"][bare].min()) < t_keyed):
            first[bare] = (ks["wait_ns"][bare] < all_in) & (
                True if t_keyed is None else ks["wait_ns"][bare] < t_keyed)
            continue                        # its start-up was unkeyed: its keyed ops are past it
        if not len(keyed):
            continue
        k0 = keyed[np.argmin(ks["wait_ns"][keyed])]
        b0 = None if starts is None else starts.get((r, int(ks["op"][k0])))
        if b0 is None:
            first[keyed] = key[keyed] == key[k0]
            continue
        ids, back = np.unique(ks["op"][keyed], return_inverse=True)      # per op, not per record
        begin = np.array([starts.get((r, o), -1) for o in ids.tolist()], np.int64)[back]
        first[keyed] = begin == b0
    return first


def held_up(ks: np.ndarray, ops: np.ndarray | None = None, starts: dict | None = None,
            first: np.ndarray | None = None) -> list[dict]:
    """Whose slowness the ranks' waits lead to. A receive's data wait on rank p passes, for the part of it during
    which p itself waited for data on that channel, to the rank p waited for, and so on up the chain; a send's
    credit wait (the receiver p had not freed room) passes likewise to the rank p waited on for credit. It never
    passes back to the rank that waited, nor more hops than there are ranks; what is left stays with the rank
    reached. Waits in each rank's first op (start-up skew: first_ops) are left out. Per rank: data_us (ranks
    waited for its data), credit_us (for room in its buffers) and their sum wait_us, largest first. ops:
    op_index(ks), if known; starts: trace.op_starts(records), if known; first: first_ops(ks, ops, starts), if known."""
    return held_up_totals(blame_by_op(ks, ops, starts, first))


def held_up_totals(by_op: dict[tuple[int, int, int], float]) -> list[dict]:
    """held_up's rows from blame_by_op's waits."""
    blame: dict[tuple[int, int], float] = {}
    for (r, kind, _), ns in by_op.items():
        blame[(r, kind)] = blame.get((r, kind), 0.0) + ns
    out = []
    for r in sorted({r for r, _ in blame}):
        d, c = blame.get((r, 0), 0.0) / 1e3, blame.get((r, 1), 0.0) / 1e3
        if d + c > 0:
            out.append({"rank": r, "wait_us": d + c, "data_us": d, "credit_us": c})
    return sorted(out, key=lambda x: (-x["wait_us"], x["rank"]))


def blame_by_op(ks: np.ndarray, ops: np.ndarray | None = None, starts: dict | None = None,
                first: np.ndarray | None = None) -> dict[tuple[int, int, int], float]:
    """held_up's waits, in ns, by (rank waited on, kind: 0 data, 1 credit, op key of the wait: op_index, -1 none)."""
    if len(ks) == 0:
        return {}
    key = op_index(ks) if ops is None else ops
    first = first_ops(ks, key, starts) if first is None else first
    tables = _waits(ks)
    m = (ks["ready_ns"] > ks["wait_ns"]) & ~first
    # a wait counts 1/C on an op of C channels: its channels wait at once, so the sums stay rank time (C of them
    # read C times the time, past the run's length, against a floor that is per op)
    weight = 1.0 / _channels_per_op(ks, key)[m]
    q = [ks["peer"][m].astype(np.int64), ks["channel"][m].astype(np.int64), ks["is_send"][m].astype(np.int64),
         ks["wait_ns"][m].astype(np.int64), ks["ready_ns"][m].astype(np.int64), ks["rank"][m].astype(np.int64),
         weight, key[m].astype(np.int64)]
    blame: dict[tuple[int, int, int], float] = {}
    hops = len(np.unique(ks["rank"]))
    for hop in range(hops):
        if not len(q[0]):
            break
        order = np.lexsort((q[2], q[1], q[0]))
        q = [a[order] for a in q]
        cuts = np.flatnonzero((np.diff(q[0]) != 0) | (np.diff(q[1]) != 0) | (np.diff(q[2]) != 0)) + 1
        nxt = []
        for lo, hi in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(q[0])])).tolist()):
            at, ch, kind = int(q[0][lo]), int(q[1][lo]), int(q[2][lo])
            s, e, origin, w, op = q[3][lo:hi], q[4][lo:hi], q[5][lo:hi], q[6][lo:hi], q[7][lo:hi]
            kept = (e - s) * w
            t = tables.get((at, ch, kind)) if hop < hops - 1 else None
            if t is not None:
                S, E, P = t
                i0 = np.searchsorted(E, s, side="right")            # intervals ending after the wait began ...
                n = np.maximum(np.searchsorted(S, e, side="left") - i0, 0)      # ... and starting before it ended
                qi = np.repeat(np.arange(len(s)), n)
                ii = np.repeat(i0, n) + np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
                ps, pe = np.maximum(s[qi], S[ii]), np.minimum(e[qi], E[ii])
                go = (pe > ps) & (P[ii] != origin[qi])
                kept = kept - np.bincount(qi[go], ((pe - ps) * w[qi])[go], len(s))
                nxt.append([P[ii][go].astype(np.int64), np.full(int(go.sum()), ch), np.full(int(go.sum()), kind),
                            ps[go], pe[go], origin[qi][go], w[qi][go], op[qi][go]])
            ids, back = np.unique(op, return_inverse=True)
            for o, ns in zip(ids.tolist(), np.bincount(back, kept, len(ids)).tolist()):
                blame[(at, kind, o)] = blame.get((at, kind, o), 0.0) + ns
        q = ([np.concatenate([b[i] for b in nxt]) for i in range(8)] if nxt
             else [np.zeros(0, np.int64)] * 6 + [np.zeros(0), np.zeros(0, np.int64)])
    return blame


def _channels_per_op(ks: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Per record, how many channels its rank's op ran on (records of no known op, key -1: as one op)."""
    trip = np.stack([ks["rank"].astype(np.int64), key.astype(np.int64), ks["channel"].astype(np.int64)], axis=1)
    uniq = np.unique(trip, axis=0)
    ops, counts = np.unique(uniq[:, :2], axis=0, return_counts=True)
    idx = np.searchsorted(ops[:, 0] * (1 << 32) + ops[:, 1], trip[:, 0] * (1 << 32) + trip[:, 1])
    return counts[idx].astype(np.float64)


def clock_check(ks: np.ndarray, tol_ns: int) -> dict:
    """Ranks' clocks against causality: a collective's receive (matched to its send by link, channel, SeqNum and
    step) cannot have its data before the send had moved it. Counts the receives ready more than tol_ns before
    their send's done clock; on one host's CLOCK_MONOTONIC none are, so each is a clock offset between ranks (GPU
    timers mapped to the host clock), which the straggler and wait verdicts would read as lateness."""
    coll = ks["seq_number"] >= 0
    send, recv = ks[coll & (ks["is_send"] == 1)], ks[coll & (ks["is_send"] == 0)]
    if not len(send) or not len(recv):
        return {"matched": 0, "early": 0, "worst_us": 0.0, "link": None}
    key = np.dtype([("src", "<i8"), ("dst", "<i8"), ("ch", "<i8"), ("seq", "<i8"), ("step", "<i8")])

    def keys(t: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        k = np.empty(len(t), key)
        k["src"], k["dst"], k["ch"], k["seq"], k["step"] = src, dst, t["channel"], t["seq_number"], t["step"]
        return k
    _, si, ri = np.intersect1d(keys(send, send["rank"], send["peer"]), keys(recv, recv["peer"], recv["rank"]),
                               return_indices=True)
    ahead = send["done_ns"][si] - recv["ready_ns"][ri]          # > 0: the data arrived before it left
    early = ahead > tol_ns
    out = {"matched": int(len(si)), "early": int(early.sum()), "worst_us": 0.0, "link": None}
    if early.any():
        w = int(np.argmax(ahead))
        out["worst_us"] = float(ahead[w]) / 1e3
        out["link"] = [int(send["rank"][si[w]]), int(send["peer"][si[w]])]
    return out
