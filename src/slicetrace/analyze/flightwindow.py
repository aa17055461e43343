"""Flight records (the flightrec plugin's traces) keep each rank's last ops only: a rank's window may begin after
another's, and a collective before it is evicted there, not missing. Its "slicetrace_flightrec" record says, per
collective function, the last SeqNum evicted (EvictedSeqNum). report leaves out a collective before some rank's
window and absent from its file (the straggler and unfinished verdicts compare ranks) only when it is whole on every
other rank: one that a rank whose window (or full trace) covers it lacks, or left unfinished, stays in, so that its
verdict is not hidden."""
from __future__ import annotations

import numpy as np

WINDOW_RECORD = "slicetrace_flightrec"      # sinks.flightrec_dump.WINDOW_RECORD (analyze does not import sinks)


def windows(records: list[dict]) -> dict:
    """pid -> the args of its slicetrace_flightrec record, for the files that are flight records."""
    return {r.get("pid"): r["args"] for r in records
            if r.get("name") == WINDOW_RECORD and r.get("ph") == "M" and type(r.get("args")) is dict}


def _starts(w: dict) -> dict:
    """Per function, the SeqNum from which a rank's window holds every collective it ran: the one after the last
    evicted (EvictedSeqNum; an unfinished op kept from before it is no start), else its first kept (FirstSeqNum)."""
    ev = w.get("EvictedSeqNum")
    if type(ev) is dict:
        return {f: s + 1 for f, s in ev.items() if type(s) is int}
    firsts = w.get("FirstSeqNum")
    return {f: s for f, s in firsts.items() if type(s) is int} if type(firsts) is dict else {}


def evicted(wins: dict, chs: np.ndarray | list[np.ndarray], spans: list) -> set[tuple[str, int]]:
    """The collectives (function, SeqNum) to leave out: before some rank's window and absent from its file, and
    whole on every other rank: its KernelCh (if the rank has any) and an ended Coll (if it has any). chs:
    trace.kernel_chs rows, or a list of such tables (each file's: none is copied into one); spans:
    trace.coll_spans rows."""
    firsts = {pid: _starts(w) for pid, w in wins.items()}
    if not any(firsts.values()):
        return set()
    got_ch = {k for t in (chs if isinstance(chs, list) else [chs])
              for k in zip(t["rank"].tolist(), t["func"].tolist(), t["seq_number"].tolist())}
    ended = {(r, f, s) for r, f, s, _, t1, *_ in spans if t1 >= 0}
    has = got_ch | {(r, f, s) for r, f, s, *_ in spans}
    with_ch, with_span = {r for r, _, _ in got_ch}, {r for r, *_ in spans}
    ranks = with_ch | with_span | {p for p in wins if type(p) is int}
    out = set()
    for func, seq in {(f, s) for _, f, s in has}:
        gone = {r for r in ranks if seq < firsts.get(r, {}).get(func, seq) and (r, func, seq) not in has}
        if gone and all((r not in with_ch or (r, func, seq) in got_ch) and (r not in with_span or (r, func, seq)
                                                                            in ended) for r in ranks - gone):
            out.add((func, seq))
    return out


def chs_in_window(chs: np.ndarray, gone: set[tuple[str, int]]) -> np.ndarray:
    """The KernelCh table (trace.kernel_chs) without the collectives `gone` (evicted())."""
    if not gone or not len(chs):
        return chs
    keep = np.array([k not in gone for k in zip(chs["func"].tolist(), chs["seq_number"].tolist())], bool)
    return chs[keep]


def spans_in_window(spans: list, gone: set[tuple[str, int]]) -> list:
    """trace.coll_spans rows without the collectives `gone` (evicted())."""
    return [s for s in spans if (s[1], s[2]) not in gone] if gone else spans


def window_note(wins: dict) -> str:
    """One line on a run's flight records: per rank the ops kept and what went before them."""
    def one(pid, w: dict) -> str:
        seqs = ", ".join(f"{f} #{a}..#{(w.get('LastSeqNum') or {}).get(f, a)}"
                         for f, a in sorted((w.get("FirstSeqNum") or {}).items()))
        return (f"rank {pid} ({w.get('Trigger')}) kept ops {w.get('FirstOp')}..{w.get('LastOp')} of "
                f"{w.get('OpsSeen')}" + (f" ({seqs})" if seqs else "") +
                f", {w.get('OpsEvicted', 0):,} op(s) and {w.get('RecordsEvicted', 0):,} record(s) evicted before")
    return ("# flight record(s) of the flightrec plugin, each rank's last ops only: "
            + "; ".join(one(p, w) for p, w in sorted(wins.items(), key=lambda kv: str(kv[0])))
            + "; collectives before a rank's window, whole on the other ranks, are left out of the verdicts")
