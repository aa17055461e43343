#!/usr/bin/env bash
# One device call (session 38): the whole CUDA test folder, the torch tests, then a traced 2-rank cuda bench with
# the example, inspector and linkstats plugins at once: the inspector lines checked against the Chrome trace's
# KernelCh spans (timing source kernel_gpu), the converter's check and report on that trace, `slicetrace diff` of
# two bench --json runs, and the linkstats files through the tests' strict Prometheus reader.
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi -L > "$OUT/smi.txt" 2>&1
PYTHONPATH=src timeout 330 python3 -m pytest -q -rs --durations=10 tests/cuda -p no:cacheprovider > "$OUT/cuda.log" 2>&1
echo "rc=$?" >> "$OUT/cuda.log"
PYTHONPATH=src timeout 200 python3 -m pytest -q -rs tests/cpu/test_torch_tensors.py tests/cpu/test_torchrun.py \
  tests/cpu/test_torchrun_store.py tests/cpu/test_launch_trial.py tests/cpu/test_comm_named_errors.py \
  tests/cpu/test_inspector.py tests/unit/test_inspector.py -p no:cacheprovider > "$OUT/torch.log" 2>&1
echo "rc=$?" >> "$OUT/torch.log"
mkdir -p "$OUT/gtr" "$OUT/ls" "$OUT/ins"
SLICETRACE_PROFILER_PLUGIN=inspector,linkstats SLICETRACE_LINKSTATS_FILE="$OUT/ls/st" SLICETRACE_INSPECTOR_DUMP_DIR="$OUT/ins" \
SLICETRACE_PROFILE_EVENT_MASK=$((2|4|32|64|65536)) PYTHONPATH=src timeout 120 python3 -m slicetrace bench --backend cuda \
  --ranks 2 --op all_reduce,all_gather,send_recv -b 64K -e 16M -f 4 -n 5 -w 2 -T 30 --trace "$OUT/gtr" \
  --json "$OUT/b1.json" > "$OUT/bench.log" 2>&1 || rc=1
PYTHONPATH=src timeout 100 python3 scripts/convert_check.py "$OUT/gtr/trace" "$OUT/g.pftrace" > "$OUT/convert.log" 2>&1 || rc=1
rm -f "$OUT/g.pftrace"
PYTHONPATH=src timeout 100 python3 -m slicetrace report "$(ls "$OUT"/gtr/trace_*_0.json | sed "s/_0.json$//")" > "$OUT/report.log" 2>&1 || rc=1
PYTHONPATH=src:. timeout 100 python3 - "$OUT/ins" "$OUT/gtr" > "$OUT/inspector.log" 2>&1 <<'PY' || rc=1
import glob, sys
from tests.helpers.inspector import check_keys, read_lines
from tests.cpu.test_inspector import _kernel_spans
lines, spans, n, src = read_lines(sys.argv[1]), {}, 0, {}
for ln in lines:
    check_keys(ln)
    h, p = ln["header"], ln["coll_perf"]
    key = (int(h["id"], 16), h["rank"])
    if key not in spans:
        spans[key] = _kernel_spans(f"{sys.argv[2]}/trace_{key[0]}_{key[1]}.json")
    src[p["coll_timing_source"]] = src.get(p["coll_timing_source"], 0) + 1
    if p["coll_timing_source"] == "kernel_gpu":
        span = spans[key][p["coll"], p["coll_sn"]]
        assert p["coll_exec_time_us"] == (span + 500) // 1000, (ln, span)
        n += 1
print(len(lines), "lines,", n, "exec times equal to the trace's KernelCh spans; timing sources", src)
assert n and set(src) <= {"kernel_gpu", "collective_cpu"}
PY
PYTHONPATH=src timeout 120 python3 -m slicetrace bench --backend cuda --ranks 2 -b 1M -e 64M -f 4 -n 20 -w 5 -N 3 \
  --json "$OUT/d1.json" > "$OUT/d1.log" 2>&1 || rc=1
PYTHONPATH=src timeout 120 python3 -m slicetrace bench --backend cuda --ranks 2 -b 1M -e 64M -f 4 -n 20 -w 5 -N 3 \
  --json "$OUT/d2.json" > "$OUT/d2.log" 2>&1 || rc=1
PYTHONPATH=src timeout 60 python3 -m slicetrace diff "$OUT/d1.json" "$OUT/d2.json" > "$OUT/diff.log" 2>&1
echo "rc=$?" >> "$OUT/diff.log"
PYTHONPATH=src:. timeout 60 python3 scripts/prom_check.py "$OUT"/ls/st_*.prom > "$OUT/prom.log" 2>&1 || rc=1
exit $rc
