#!/usr/bin/env bash
# One device call (session 39): the whole CUDA test folder; the torch, inspector and flight-recorder tests; a traced
# 2-rank cuda bench with the example and flightrec plugins (DUMP=always): each rank's flight record checked against
# the example trace of the same run (the kept ops' KernelSteps equal), then check_trace, report and convert on it.
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi -L > "$OUT/smi.txt" 2>&1
PYTHONPATH=src timeout 330 python3 -m pytest -q -rs --durations=10 tests/cuda -p no:cacheprovider > "$OUT/cuda.log" 2>&1
echo "rc=$?" >> "$OUT/cuda.log"
PYTHONPATH=src timeout 200 python3 -m pytest -q -rs tests/cpu/test_torch_tensors.py tests/cpu/test_torchrun.py \
  tests/cpu/test_torchrun_store.py tests/cpu/test_inspector.py tests/cpu/test_flightrec.py tests/unit/test_flightrec.py \
  -p no:cacheprovider > "$OUT/torch.log" 2>&1
echo "rc=$?" >> "$OUT/torch.log"
mkdir -p "$OUT/gtr" "$OUT/fr"
SLICETRACE_PROFILER_PLUGIN=example,flightrec SLICETRACE_FLIGHTREC_DUMP=always SLICETRACE_FLIGHTREC_OPS=8 \
SLICETRACE_FLIGHTREC_FILE="$OUT/fr/rec" SLICETRACE_PROFILE_DUMP_FILE="$OUT/gtr/trace" PYTHONPATH=src timeout 120 \
  python3 -m slicetrace bench --backend cuda --ranks 2 --op all_reduce,all_gather -b 64K -e 16M -f 4 -n 5 -w 2 \
  > "$OUT/bench.log" 2>&1 || rc=1
PYTHONPATH=src timeout 100 python3 - "$OUT/fr" "$OUT/gtr" > "$OUT/flightrec.log" 2>&1 <<'PY' || rc=1
import glob, sys
from slicetrace.analyze import check_trace
from slicetrace.analyze.records import read_records
def steps(recs, window):
    """(function, SeqNum, channel, direction, step, ts, dur) of the KernelSteps of the ops in the window; the
    function from the parent Coll/P2p (ParentId), as SeqNums count per function."""
    func = {r["id"]: r["name"] for r in recs if r.get("cat") in ("COLL", "P2P") and r.get("ph") == "b"}
    out = []
    for r in recs:
        if r.get("name") == "KernelStep":
            a, f = r["args"], func.get(r["args"]["ParentId"])
            if f in window and window[f][0] <= a["SeqNum"] <= window[f][1]:
                out.append((f, a["SeqNum"], a["Channel"], a["IsSend"], a["Step"], r["ts"], r["dur"]))
    return sorted(out)
files = sorted(glob.glob(sys.argv[1] + "/rec_*.json"))
assert len(files) == 2, files
for f in files:
    assert check_trace(f) == [], f
    recs = read_records(f)
    (w,) = [r["args"] for r in recs if r.get("name") == "slicetrace_flightrec"]
    full = read_records(glob.glob(sys.argv[2] + "/trace_*_" + f.rsplit("_", 1)[1])[0])
    window = {f: (w["FirstSeqNum"][f], last) for f, last in w["LastSeqNum"].items()}
    kept = steps(recs, window)
    same = kept == steps(full, window)
    print(f, "window", w["FirstSeqNum"], w["LastSeqNum"], "kept", w["OpsKept"], "evicted", w["OpsEvicted"],
          "KernelSteps", len(kept), "equal to the example trace's" if same else "DIFFERENT")
    assert kept and same
PY
PYTHONPATH=src timeout 100 python3 -m slicetrace report "$OUT/fr/rec" --partial > "$OUT/report.log" 2>&1; echo "rc=$?" >> "$OUT/report.log"
PYTHONPATH=src timeout 100 python3 scripts/convert_check.py "$OUT/gtr/trace" "$OUT/g.pftrace" > "$OUT/convert.log" 2>&1 || rc=1
rm -f "$OUT/g.pftrace"
PYTHONPATH=src timeout 120 python3 -m slicetrace bench --backend cuda --ranks 2 -b 1M -e 64M -f 4 -n 20 -w 5 \
  > "$OUT/bench_plain.log" 2>&1 || rc=1
exit ${rc:-0}
