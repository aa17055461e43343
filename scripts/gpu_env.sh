# Sourced by the GPU scripts: strict pipes, the repository root, the device settings every GPU run keeps (README),
# the prebuilt-kernel cache, the log folder $OUT, and rc=0 for the script to raise.
set -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SLICETRACE_CACHE_DIR=$PWD/.kcache
OUT=${OUT:-out}; mkdir -p "$OUT"
rc=0
