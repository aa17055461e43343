"""Check `slicetrace convert` on real traces: every KernelStep send whose receive is in the files (all, unless a
rank's file is missing or cut short) gets exactly one flow to a receive (same step, mirrored ranks), carried by
instants inside the slices, every slice comes out as one begin and one end, and no track has overlapping slices
(in file order, Perfetto's order among equal timestamps). --all-comms: files of several communicators of one job,
in one trace (convert --all-comms); sends pair with receives of their own communicator.

    python scripts/convert_check.py TRACE_PREFIX OUT.pftrace [--all-comms]
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict

from slicetrace.analyze.perfetto import convert, wire_fields as fields
from slicetrace.analyze.trace import comm_of, load_trace, trace_files


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("traces")
    ap.add_argument("out")
    ap.add_argument("--all-comms", action="store_true")
    a = ap.parse_args()
    files = trace_files(a.traces)
    by_file = [(f, load_trace(f)) for f in files]
    recs = [r for _, rs in by_file for r in rs]
    got = convert(files, a.out, all_comms=a.all_comms)
    sends = sum(1 for r in recs if r.get("name") == "KernelStep" and r["args"]["IsSend"])
    paired = _pairable(by_file)
    slices = sum(1 for r in recs if r.get("ph") in ("X", "b"))
    begins = ends = instants = flows = flow_ends = overlaps = 0
    depth: dict = defaultdict(int)
    for _, pkt in fields(open(a.out, "rb").read()):
        p = dict((f, v) for f, v in fields(pkt) if f in (8, 11))
        if 11 not in p:
            continue
        e = fields(p[11])
        kind = dict(e).get(9)
        track = dict(e).get(11)
        begins += kind == 1
        ends += kind == 2
        instants += kind == 3
        flows += sum(1 for f, _ in e if f == 47 and kind == 3)
        flow_ends += sum(1 for f, _ in e if f == 48 and kind == 3)
        depth[track] += 1 if kind == 1 else -1 if kind == 2 else 0
        overlaps += not 0 <= depth[track] <= 1 or (kind == 3 and depth[track] != 1)     # an instant in its slice
    print(f"files {got['files']} slices {slices} begins {begins} ends {ends} instants {instants} sends {sends} "
          f"with a receive in the files {paired} flows {flows} flow_ends {flow_ends} tracks {got['tracks']} "
          f"overlaps {overlaps}")
    ok = (begins == ends == slices and flows == flow_ends == paired == got["flows"] and instants == 2 * paired
          and overlaps == 0)
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


def _pairable(by_file: list[tuple[str, list[dict]]]) -> int:
    """Sends that have a receive in the files (all of them, unless a rank's file is missing or cut short): per
    communicator, connection and step (ring and point-to-point steps counted apart, by the parent's category), as
    many as the fewer of its sends and receives. Pids are ranks here (load_trace), one communicator's per file."""
    ends: dict = defaultdict(lambda: [0, 0])
    for f, recs in by_file:
        comm = comm_of(f, recs)
        cat = {(r["pid"], r.get("id")): r.get("cat") for r in recs
               if r.get("ph") == "b" and r.get("cat") in ("COLL", "P2P")}
        for r in recs:
            if r.get("name") == "KernelStep":
                a, snd = r["args"], 1 if r["args"]["IsSend"] else 0
                src, dst = (r["pid"], a["Peer"]) if snd else (a["Peer"], r["pid"])
                kind = cat.get((r["pid"], a.get("ParentId")))
                if kind is None and a.get("ParentId", -1) >= 0:    # its op not written (cut short): a Coll has a SeqNum
                    kind = "COLL" if a.get("SeqNum", -1) >= 0 else "P2P"
                ends[(comm, kind, src, dst, a["Channel"], a["Step"])][snd] += 1
    return sum(min(v) for v in ends.values())


if __name__ == "__main__":
    sys.exit(main())
