#!/usr/bin/env bash
# One device call (session 35): the whole CUDA test folder, the torch CPU tests, the init line at
# SLICETRACE_DEBUG=INFO on cuda, a traced 2-rank cuda bench with ProxyCtrl in the mask, the converter's check,
# Ctrl-C on a traced cuda bench (its ranks asked to close first), and ours against NCCL on one GPU.
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi -L > "$OUT/smi.txt" 2>&1
PYTHONPATH=src timeout 400 python3 -m pytest -q -rs --durations=15 tests/cuda -p no:cacheprovider > "$OUT/cuda.log" 2>&1
echo "rc=$?" >> "$OUT/cuda.log"
PYTHONPATH=src timeout 150 python3 -m pytest -q -rs tests/cpu/test_torch_tensors.py tests/cpu/test_torchrun.py tests/cpu/test_torchrun_store.py tests/cpu/test_torchrun_reinit.py tests/cpu/test_init_log.py -p no:cacheprovider > "$OUT/torch.log" 2>&1
echo "rc=$?" >> "$OUT/torch.log"
SLICETRACE_DEBUG=INFO PYTHONPATH=src timeout 60 python3 -m slicetrace bench --backend cuda --ranks 2 -b 1M -e 1M \
  -n 2 -w 1 --profile > "$OUT/info.log" 2>&1 || rc=1
mkdir -p "$OUT/gtr"
SLICETRACE_PROFILE_EVENT_MASK=$((2|4|32|64|65536)) PYTHONPATH=src timeout 120 python3 -m slicetrace bench --backend cuda \
  --ranks 2 --op all_reduce,send_recv -b 64K -e 16M -f 4 -n 5 -w 2 -T 30 --trace "$OUT/gtr" > "$OUT/bench.log" 2>&1 || rc=1
PYTHONPATH=src timeout 100 python3 scripts/convert_check.py "$OUT/gtr/trace" "$OUT/g.pftrace" > "$OUT/convert.log" 2>&1 || rc=1
rm -f "$OUT/g.pftrace"
PYTHONPATH=src timeout 120 python3 scripts/gpu_ctrlc_check.py /tmp/ctrlc35 2 > "$OUT/ctrlc.log" 2>&1 || rc=1
cp /tmp/ctrlc35.err "$OUT/ctrlc.err" 2>/dev/null
PYTHONPATH=src timeout 150 python3 -m slicetrace bench --backend cuda --ranks 1 --compare nccl -b 1M -e 1G -f 8 -n 20 \
  -w 5 > "$OUT/nccl1.log" 2>&1 || rc=1
exit $rc
