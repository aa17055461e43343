#!/usr/bin/env bash
# One device call (session 37): the whole CUDA test folder (errors now name their communicator; the Chrome sink
# writes names first), the torch tests (op names in any case, RANK alone refused, a dead store server), a traced
# 2-rank cuda bench with the example and linkstats plugins at once, the converter's check and report on that trace,
# and the linkstats files through the strict Prometheus reader of the tests.
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi -L > "$OUT/smi.txt" 2>&1
PYTHONPATH=src timeout 400 python3 -m pytest -q -rs --durations=10 tests/cuda -p no:cacheprovider > "$OUT/cuda.log" 2>&1
echo "rc=$?" >> "$OUT/cuda.log"
PYTHONPATH=src timeout 240 python3 -m pytest -q -rs tests/cpu/test_torch_tensors.py tests/cpu/test_torchrun.py \
  tests/cpu/test_torchrun_store.py tests/cpu/test_torchrun_reinit.py tests/cpu/test_launch_trial.py \
  tests/cpu/test_init_log.py tests/cpu/test_launcher_errors.py tests/cpu/test_comm_named_errors.py \
  tests/cpu/test_store_server_gone.py -p no:cacheprovider > "$OUT/torch.log" 2>&1
echo "rc=$?" >> "$OUT/torch.log"
mkdir -p "$OUT/gtr" "$OUT/ls"
SLICETRACE_PROFILER_PLUGIN=linkstats SLICETRACE_LINKSTATS_FILE="$OUT/ls/st" \
SLICETRACE_PROFILE_EVENT_MASK=$((2|4|32|64|65536)) PYTHONPATH=src timeout 120 python3 -m slicetrace bench --backend cuda \
  --ranks 2 --op all_reduce,send_recv -b 64K -e 16M -f 4 -n 5 -w 2 -T 30 --trace "$OUT/gtr" > "$OUT/bench.log" 2>&1 || rc=1
PYTHONPATH=src timeout 100 python3 scripts/convert_check.py "$OUT/gtr/trace" "$OUT/g.pftrace" > "$OUT/convert.log" 2>&1 || rc=1
rm -f "$OUT/g.pftrace"
PYTHONPATH=src timeout 100 python3 -m slicetrace report "$(ls "$OUT"/gtr/trace_*_0.json | sed "s/_0.json$//")" > "$OUT/report.log" 2>&1 || rc=1
PYTHONPATH=src:. timeout 60 python3 scripts/prom_check.py "$OUT"/ls/st_*.prom > "$OUT/prom.log" 2>&1 || rc=1
exit $rc
