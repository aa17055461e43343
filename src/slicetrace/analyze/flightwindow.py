"""Flight records (the flightrec plugin's traces) keep each rank's last ops only: a rank's window may begin after
another's, and a collective before it is evicted there, not missing. Its "slicetrace_flightrec" record says, per
collective function, the first SeqNum kept (FirstSeqNum); report leaves out the collectives before any rank's window
(the straggler and unfinished verdicts compare ranks), as it would leave out those a rank lacks, without calling
them missing."""
from __future__ import annotations

import numpy as np

WINDOW_RECORD = "slicetrace_flightrec"      # sinks.flightrec_dump.WINDOW_RECORD (analyze does not import sinks)


def windows(records: list[dict]) -> dict:
    """pid -> the args of its slicetrace_flightrec record, for the files that are flight records."""
    return {r.get("pid"): r["args"] for r in records
            if r.get("name") == WINDOW_RECORD and r.get("ph") == "M" and type(r.get("args")) is dict}


def first_kept(wins: dict) -> dict[str, int]:
    """Per collective function, the SeqNum from which every flight-recorded rank kept its ops."""
    out: dict[str, int] = {}
    for w in wins.values():
        firsts = w.get("FirstSeqNum")
        for func, seq in (firsts.items() if type(firsts) is dict else ()):
            if type(seq) is int:
                out[func] = max(out.get(func, seq), seq)
    return out


def chs_in_window(chs: np.ndarray, firsts: dict[str, int]) -> np.ndarray:
    """The KernelCh table (trace.kernel_chs) without the collectives before a window."""
    if not firsts or not len(chs):
        return chs
    funcs, seqs = chs["func"].tolist(), chs["seq_number"].tolist()
    keep = np.array([seq >= firsts.get(f, seq) for f, seq in zip(funcs, seqs)], bool)
    return chs[keep]


def spans_in_window(spans: list, firsts: dict[str, int]) -> list:
    """trace.coll_spans rows without the collectives before a window."""
    return [s for s in spans if s[2] >= firsts.get(s[1], s[2])] if firsts else spans


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
            + "; collectives before a rank's window are left out of the verdicts")
