"""One job's communicators in one analysis (`convert --all-comms`, `report --all-comms`): which communicator a file
is, each communicator's facts (name, time range, first op), their order (first op first, as convert lays out its
processes: perfetto_tracks.places), and the guard against pooling different runs.

The guard: the example plugin's records say nothing of the host or boot they came from (slicetrace_comm carries
Rank, nRanks, CommHash, commName and EventMask), and CLOCK_MONOTONIC restarts at each boot, so separate runs are
told apart by time alone: communicators whose time ranges do not overlap at all, in two or more groups, are named
in a warning. A warning, not a refusal: one job's communicator used only in one phase (a setup barrier) does not
overlap the others either.
"""
from __future__ import annotations

import logging
import math
import os
import re
from typing import NamedTuple

from .records import _U64

ALL_COMMS = "--all-comms"       # the flag report and convert take, named in their messages
POOLED = {"convert": "put each in one trace (a process per communicator and rank)", "report": "report each in turn"}
log = logging.getLogger("slicetrace")


class CommFacts(NamedTuple):
    comm: str                   # the CommHash, in decimal (as in the file names)
    name: str | None            # slicetrace_comm's commName, where recorded
    first_ns: float             # its first op's begin (its first slice's where no op was recorded; inf: neither)
    lo_ns: float                # its records' time range (inf, -inf: none)
    hi_ns: float


def comm_of(path: str, records: list[dict]) -> str:
    """A file's communicator: its records' CommHash, else the <commHash> of its name, else the name."""
    for r in records:              # read before the records are checked: args may be anything
        a = r.get("args")
        h = a.get("CommHash") if isinstance(a, dict) else None
        # a malformed hash ('x', -1) is record_problem's to name: taken here, it made the file a run of its own
        # and the error "2 communicators", whose suggested commands select that same file again
        if type(h) is int and 0 <= h <= _U64:
            return str(h)
    m = re.search(r"_(\d+)_\d+\.json$", path)
    return m.group(1) if m else os.path.basename(path)


def pid_comms(records: list[dict]) -> dict:
    """pid -> the CommHash (decimal) its records carry first: one communicator's files name one each."""
    out: dict = {}
    for r in records:
        h = r["args"].get("CommHash") if type(r.get("args")) is dict else None
        if type(h) is int:
            out.setdefault(r.get("pid"), str(h))
    return out


def file_facts(path: str, records: list[dict]) -> CommFacts:
    """One file's CommFacts (records that passed record_problem)."""
    name, op, lo, hi = None, math.inf, math.inf, -math.inf
    for r in records:
        ts = r.get("ts")
        if r.get("name") == "slicetrace_comm" and isinstance(r.get("args"), dict) and name is None:
            name = r["args"].get("commName") if isinstance(r["args"].get("commName"), str) else None
        if r.get("ph") not in ("X", "b", "e", "i") or not isinstance(ts, (int, float)):
            continue
        t = float(ts) * 1000
        lo, hi = min(lo, t), max(hi, t + float(r.get("dur", 0)) * 1000)
        if r.get("ph") == "b" and r.get("cat") in ("COLL", "P2P"):
            op = min(op, t)
    first = op if op < math.inf else min((float(r["ts"]) * 1000 for r in records if r.get("ph") in ("X", "b")
                                          and isinstance(r.get("ts"), (int, float))), default=math.inf)
    return CommFacts(comm_of(path, records), name, first, lo, hi)


def merged(facts: list[CommFacts]) -> CommFacts:
    """One communicator's facts from its files' (an op's first begin over them, the union of their ranges)."""
    ops = [f.first_ns for f in facts]
    return CommFacts(facts[0].comm, next((f.name for f in facts if f.name), None), min(ops),
                     min(f.lo_ns for f in facts), max(f.hi_ns for f in facts))


def in_order(facts: list[CommFacts]) -> list[int]:
    """The indices of `facts` (one per communicator) in their order: first op first, then by hash."""
    return sorted(range(len(facts)), key=lambda i: (facts[i].first_ns, facts[i].comm))


def label(f: CommFacts) -> str:
    return f"commHash {f.comm}" + (f" ({f.name})" if f.name else "")


def apart(facts: list[CommFacts]) -> list[list[CommFacts]]:
    """The communicators in groups whose time ranges overlap, chained (a, b overlap and b, c: one group), in time
    order; communicators without a timed record are left out. One group: nothing says the files are of two runs."""
    groups: list[list[CommFacts]] = []
    end = -math.inf
    for f in sorted((f for f in facts if f.lo_ns <= f.hi_ns), key=lambda f: (f.lo_ns, f.comm)):
        if not groups or f.lo_ns > end:
            groups.append([])
        groups[-1].append(f)
        end = max(end, f.hi_ns)
    return groups


def warn_apart(facts: list[CommFacts], command: str, files: dict[str, list[str]]) -> list[list[str]]:
    """Warn when the communicators fall into groups that never overlap in time (apart): files of separate runs (or
    hosts, boots) may be pooled; the warning gives the command that takes each group alone (files: each
    communicator's). Returns the groups' hashes."""
    groups = apart(facts)
    if len(groups) > 1:
        t0 = groups[0][0].lo_ns
        said = "; ".join(", ".join(label(f) for f in g) + f" at {(g[0].lo_ns - t0) / 1e9:.6f}.."
                         f"{(max(f.hi_ns for f in g) - t0) / 1e9:.6f} s" for g in groups)
        each = "; ".join(f"slicetrace {command} " + " ".join(_run_prefix(files[f.comm]) for f in g)
                         + (f" {ALL_COMMS}" if len(g) > 1 else "")
                         + (f" -o run_{g[0].comm}.pftrace" if command == "convert" else "") for g in groups)
        log.warning("slicetrace %s %s: the communicators' time ranges fall into %d groups that never overlap (%s): "
                    "files of separate runs (hosts, boots) pooled? The traces record no host or boot, so this is "
                    "judged by time alone; if they are separate runs, take each alone: %s", command, ALL_COMMS,
                    len(groups), said, each)
    return [[f.comm for f in g] for g in groups]


def picks(by_comm: dict[str, list], command: str) -> str:
    """How to take each communicator's files (by_comm: hash -> its files, or (file, records) pairs) on its own:
    `slicetrace <command> <prefix>` (convert's with its -o, one output per communicator named by its hash)."""
    def name(fs: list) -> list[str]:
        return [f if isinstance(f, str) else f[0] for f in fs]
    return "; ".join(f"commHash {c} ({len(fs)} file(s)): slicetrace {command} {_run_prefix(name(fs))}"
                     + (f" -o run_{c}.pftrace" if command == "convert" else "") for c, fs in by_comm.items())


def _run_prefix(files: list[str]) -> str:
    """What selects these files on the command line: their <prefix>_<commHash>, else the files themselves."""
    prefixes = {re.sub(r"_\d+\.json$", "", f) for f in files}
    if len(prefixes) == 1 and all(re.search(r"_\d+_\d+\.json$", f) for f in files):
        return os.path.relpath(prefixes.pop())
    return " ".join(os.path.relpath(f) for f in files)
