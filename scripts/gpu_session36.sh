#!/usr/bin/env bash
# One device call (session 36): the whole CUDA test folder (the drain's and event path's changes run there too),
# the torch CPU tests (ReduceOp, a default process group, a failed rank under launch), a traced 2-rank cuda bench
# with ProxyCtrl in the mask, the converter's check and report on that trace (the per-op most-waited-on rule).
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi -L > "$OUT/smi.txt" 2>&1
PYTHONPATH=src timeout 400 python3 -m pytest -q -rs --durations=10 tests/cuda -p no:cacheprovider > "$OUT/cuda.log" 2>&1
echo "rc=$?" >> "$OUT/cuda.log"
PYTHONPATH=src timeout 200 python3 -m pytest -q -rs tests/cpu/test_torch_tensors.py tests/cpu/test_torchrun.py \
  tests/cpu/test_torchrun_store.py tests/cpu/test_torchrun_reinit.py tests/cpu/test_launch_trial.py \
  tests/cpu/test_init_log.py -p no:cacheprovider > "$OUT/torch.log" 2>&1
echo "rc=$?" >> "$OUT/torch.log"
mkdir -p "$OUT/gtr"
SLICETRACE_PROFILE_EVENT_MASK=$((2|4|32|64|65536)) PYTHONPATH=src timeout 120 python3 -m slicetrace bench --backend cuda \
  --ranks 2 --op all_reduce,send_recv -b 64K -e 16M -f 4 -n 5 -w 2 -T 30 --trace "$OUT/gtr" > "$OUT/bench.log" 2>&1 || rc=1
PYTHONPATH=src timeout 100 python3 scripts/convert_check.py "$OUT/gtr/trace" "$OUT/g.pftrace" > "$OUT/convert.log" 2>&1 || rc=1
rm -f "$OUT/g.pftrace"
PYTHONPATH=src timeout 100 python3 -m slicetrace report "$(ls "$OUT"/gtr/trace_*_0.json | sed "s/_0.json$//")" > "$OUT/report.log" 2>&1 || rc=1
exit $rc
