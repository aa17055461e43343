"""Check `slicetrace convert` on real traces: every KernelStep send gets exactly one flow to a receive (same
step, mirrored ranks), every slice comes out as one begin and one end, and no track has overlapping slices.

    python scripts/convert_check.py TRACE_PREFIX OUT.pftrace
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict

from slicetrace.analyze.perfetto import convert, wire_fields as fields
from slicetrace.analyze.trace import load_traces, trace_files


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("traces")
    ap.add_argument("out")
    a = ap.parse_args()
    files = trace_files(a.traces)
    recs = load_traces(files)
    got = convert(files, a.out)
    sends = sum(1 for r in recs if r.get("name") == "KernelStep" and r["args"]["IsSend"])
    slices = sum(1 for r in recs if r.get("ph") in ("X", "b"))
    begins = ends = flows = flow_ends = 0
    per_track = defaultdict(list)
    for _, pkt in fields(open(a.out, "rb").read()):
        p = dict((f, v) for f, v in fields(pkt) if f in (8, 11))
        if 11 not in p:
            continue
        e = fields(p[11])
        kind = dict(e).get(9)
        track = dict(e).get(11)
        begins += kind == 1
        ends += kind == 2
        flows += sum(1 for f, _ in e if f == 47)
        flow_ends += sum(1 for f, _ in e if f == 48)
        per_track[track].append((p[8], 0 if kind == 2 else 1))
    overlaps = 0
    for evs in per_track.values():
        depth = 0
        for _, k in sorted(evs):
            depth += 1 if k else -1
            overlaps += depth > 1
    print(f"files {got['files']} slices {slices} begins {begins} ends {ends} sends {sends} flows {flows} "
          f"flow_ends {flow_ends} tracks {got['tracks']} overlaps {overlaps}")
    ok = begins == ends == slices and flows == flow_ends == sends and overlaps == 0
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
