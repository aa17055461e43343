#!/usr/bin/env bash
# Session 28, last call: the CUDA tests on the session's final tree, the torch 2.11 CPU tests (torchrun, restarts,
# signals, torch tensors), and SIGINT / SIGTERM to a traced 2-rank CUDA bench's group. Carry .kcache. Logs in $OUT.
source "$(dirname "$0")/gpu_env.sh"
PYTHONPATH=src timeout 340 python3 -m pytest -q -rs --durations=5 tests/cuda -p no:cacheprovider > "$OUT/cuda.log" 2>&1
echo "rc=$?" >> "$OUT/cuda.log"
PYTHONPATH=src timeout 150 python3 -m pytest -q -rs -p no:cacheprovider tests/cpu/test_torch_tensors.py \
  tests/cpu/test_torchrun.py tests/cpu/test_torchrun_reinit.py tests/cpu/test_torchrun_store.py \
  tests/cpu/test_launcher_signals.py tests/cpu/test_interrupt_review.py tests/cpu/test_launch_review.py \
  tests/cpu/test_api_review.py > "$OUT/torch.log" 2>&1
echo "rc=$?" >> "$OUT/torch.log"
for s in INT TERM; do
  PYTHONPATH=src timeout 60 python3 scripts/gpu_ctrlc_check.py /tmp/sig_$s 2 cuda $s >> "$OUT/signal.log" 2>&1
  echo "rc=$? ($s)" >> "$OUT/signal.log"
done
