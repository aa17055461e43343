#!/usr/bin/env bash
# One device call at the end of a session: the CUDA tests, the trace check, and small send_recv/all_to_all against
# NCCL for this tree and ./prev (git archive REV src | tar -x -C prev), alternating: gpu_p2p_ab.sh without its
# traced convert check. Logs in $OUT.
SKIP_CONVERT=1 SIZES="${SIZES:--b 8 -e 256K -f 8}" ITERS="-n 50 -w 10" AB_TIMEOUT=100 AB_LOG=ab_small.log \
  exec bash "$(dirname "$0")/gpu_p2p_ab.sh"
