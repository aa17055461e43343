"""The "most waited on" verdict: a rank is named when the waits led to it in more ops than chance explains.

Totals alone named a rank in healthy oversubscribed runs (4 ranks on 2 cores: whoever the scheduler delays differs
from op to op, and a few long delays make one rank's total twice the next). Counted per op, as the straggler and
slow-link verdicts count theirs (verdicts.beyond_chance), a rank must hold the others up op after op.
"""
from __future__ import annotations

import numpy as np

from .verdicts import ALPHA, OP_FRACTION, beyond_chance, chance_of


def op_span_us(ks: np.ndarray, key: np.ndarray) -> float:
    """The median op's span in us: per (rank, op key), its first wait clock to its last done clock (keyed only)."""
    m = key >= 0
    if not m.any():
        return 0.0
    pair = np.stack([ks["rank"][m].astype(np.int64), key[m].astype(np.int64)], axis=1)
    uniq, back = np.unique(pair, axis=0, return_inverse=True)
    back = back.reshape(-1)
    lo = np.full(len(uniq), np.iinfo(np.int64).max)
    hi = np.full(len(uniq), np.iinfo(np.int64).min)
    np.minimum.at(lo, back, ks["wait_ns"][m].astype(np.int64))
    np.maximum.at(hi, back, ks["done_ns"][m].astype(np.int64))
    return float(np.median(hi - lo)) / 1e3


def most_waited(blame: dict[tuple[int, int, int], float], ops: int, n_ranks: int, floor_us: float) -> dict:
    """From verdicts.blame_by_op: per op (key >= 0), the rank whose waits there came to the most, if more than
    floor_us (waits_floor) and more than any other rank's. A rank is named (`consistent`) when it held the others up
    so in more of the `ops` judged (every keyed op after the first, waited in or not) than chance explains, and the
    waits lead to it most in all: `chance`, the odds that a rank picked at random per op (1 in n_ranks) is picked as
    often, at most ALPHA over the n_ranks tests (`beyond_chance`). Returns the rule ("ops", "floor_us", "p", "tests",
    "needed": the fewest ops that would be named, "largest": the rank of the largest total) and "ranks": per rank
    held up so, {rank, ops, chance, beyond_chance, consistent}, most ops first."""
    per_op: dict[int, dict[int, float]] = {}
    for (rank, _, op), ns in blame.items():
        if op >= 0:
            waits = per_op.setdefault(op, {})
            waits[rank] = waits.get(rank, 0.0) + ns / 1e3
    p, tests = 1 / max(n_ranks, 2), max(n_ranks, 2)
    count: dict[int, int] = {}
    for waits in per_op.values():
        most = sorted(waits.values())
        rank = max(waits, key=waits.__getitem__)
        if most[-1] > floor_us and (len(most) == 1 or most[-2] < most[-1]):     # a tie holds nobody up more
            count[rank] = count.get(rank, 0) + 1
    total: dict[int, float] = {}
    for (rank, _, _), ns in blame.items():
        total[rank] = total.get(rank, 0.0) + ns
    largest = max(sorted(total), key=total.__getitem__) if total else None
    rows = [{"rank": r, "ops": k, "chance": chance_of(k, ops, p)} for r, k in count.items()]
    for row in rows:
        row["beyond_chance"] = beyond_chance(row["ops"], row["chance"], tests)
        # and the waits' largest total: one CPU's ranks crowded beside other work were held up in 31 % of ops (20 %
        # by chance) while a rank with its own busy CPU drew more wait in all (verdict_trial.py, busy)
        row["consistent"] = row["beyond_chance"] and row["rank"] == largest
    rows.sort(key=lambda d: (-d["ops"], d["rank"]))
    return {"ops": ops, "floor_us": floor_us, "p": p, "tests": tests, "alpha": ALPHA,
            "needed": _needed(ops, p, tests), "largest": largest, "ranks": rows}


def waits_floor(straggler_rule: dict, ks: np.ndarray, key: np.ndarray) -> float:
    """The per-op floor most_waited uses: the straggler verdict's, else (no collective judged: p2p only, or no
    KernelCh and Coll records) OP_FRACTION x the median op's span from its KernelSteps."""
    return straggler_rule["floor_us"] if straggler_rule.get("collectives") else OP_FRACTION * op_span_us(ks, key)


def _needed(n: int, p: float, tests: int) -> int | None:
    """The fewest of n ops that a rank must hold up to be beyond chance (None: not even all n)."""
    lo, hi = int(n * p), n                  # at or below the mean never; chance falls as the count grows
    if n < 2 or not beyond_chance(hi, chance_of(hi, n, p), tests):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if beyond_chance(mid, chance_of(mid, n, p), tests) else (mid, hi)
    return hi
