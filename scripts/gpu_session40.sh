#!/usr/bin/env bash
# One device call (session 40): the whole CUDA test folder; the torch, inspector, flight-recorder and trace-check
# tests; a killed rank's peer's traces on cuda through check_trace (scripts/fail_trace_check.py, the op's channels
# that never ended included); a plain 2-rank cuda bench.
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi -L > "$OUT/smi.txt" 2>&1
PYTHONPATH=src timeout 330 python3 -m pytest -q -rs --durations=10 tests/cuda -p no:cacheprovider > "$OUT/cuda.log" 2>&1
echo "rc=$?" >> "$OUT/cuda.log"
PYTHONPATH=src timeout 200 python3 -m pytest -q -rs tests/cpu/test_torch_tensors.py tests/cpu/test_torchrun.py \
  tests/cpu/test_torchrun_store.py tests/cpu/test_inspector.py tests/cpu/test_flightrec.py tests/unit/test_flightrec.py \
  tests/unit/test_trace_unfinished.py tests/unit/test_runtables_window.py -p no:cacheprovider > "$OUT/torch.log" 2>&1
echo "rc=$?" >> "$OUT/torch.log"
PYTHONPATH=src timeout 150 python3 scripts/fail_trace_check.py "$OUT/fail" --backend cuda --trials 3 --nchannels 4 \
  --delay 3 > "$OUT/fail.log" 2>&1 || rc=1
rm -rf "$OUT/fail"
PYTHONPATH=src timeout 120 python3 -m slicetrace bench --backend cuda --ranks 2 -b 1M -e 64M -f 4 -n 20 -w 5 \
  > "$OUT/bench_plain.log" 2>&1 || rc=1
exit ${rc:-0}
