#!/usr/bin/env python3
"""Does a system-scope fence wait for host-memory stores issued by *other* warps of its block?

The KernelStep overhead on the GPU comes from fences that wait for pending PCIe stores of stamps. If a fence
only waits for its own warp's stores, a stamp warp separate from the post warp would take the stamps off the
data path's critical path. One block per SM; warp 0 lane 0 times `fence.acq_rel.sys` (median of iterations,
%globaltimer ns); warp 1 (all lanes) keeps stores in flight, depending on the mode.

    PYTHONPATH=src python3 scripts/gpu_fence_probe.py [--blocks 1,64] [--iters 200]
"""
from __future__ import annotations

import argparse

SRC = r'''
typedef unsigned long long u64;
__device__ __forceinline__ u64 gt() { u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ void fence_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ void st_vol(u64* p, u64 v) { asm volatile("st.volatile.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory"); }
// mode 0: fence alone; 1: another warp stores to host memory; 2: the fencing thread stores 10 words to host
// memory before each fence; 3: another warp stores to device memory; 4: the fencing warp's 32 lanes store one
// word each to host memory before each fence (as the post warp's stamp lanes do)
extern "C" __global__ void probe(u64* host, u64* dev, u64* out, int mode, int iters, volatile int* stop) {
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  u64* hb = host + (u64)blockIdx.x * 4096;
  u64* db = dev + (u64)blockIdx.x * 4096;
  if (w == 1) {
    if (mode == 1 || mode == 3) {
      u64* p = mode == 1 ? hb : db;
      for (int i = 0; !*stop && i < 1000000; i++) st_vol(p + ((lane + 32 * i) & 2047) + 2048, i);
    }
    return;
  }
  __shared__ u64 ts[1024];
  for (int i = 0; i < iters; i++) {
    if (mode == 4) st_vol(hb + ((lane + 32 * i) & 2047), i);
    __syncwarp();
    if (lane == 0) {
      if (mode == 2) for (int k = 0; k < 10; k++) st_vol(hb + ((k + 16 * i) & 2047), i);
      const u64 t0 = gt();
      fence_sys();
      ts[i & 1023] = gt() - t0;
    }
    __syncwarp();
  }
  if (lane == 0) {
    int n = iters < 1024 ? iters : 1024;      // median by counting (n is small)
    u64 best = 0;
    for (int a = 0; a < n; a++) {
      int le = 0;
      for (int b = 0; b < n; b++) le += ts[b] <= ts[a];
      if (le >= (n + 1) / 2 && (best == 0 || ts[a] < best)) best = ts[a];
    }
    out[blockIdx.x] = best;
    if (blockIdx.x == 0) *stop = 1;
  }
}
'''


def main() -> None:
    import cupy as cp
    import numpy as np
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", default="1,64")
    p.add_argument("--iters", type=int, default=200)
    a = p.parse_args()
    mod = cp.RawModule(code=SRC, options=("-std=c++17",))
    k = mod.get_function("probe")
    nb_max = max(int(b) for b in a.blocks.split(","))
    hptr = cp.cuda.runtime.hostAlloc(nb_max * 4096 * 8, 3)          # portable | mapped
    dev = cp.zeros(nb_max * 4096, dtype=cp.uint64)
    names = ["fence alone", "other warp -> host stores", "same thread: 10 host stores", "other warp -> device",
             "own warp lanes: 1 host store each"]
    for nb in (int(b) for b in a.blocks.split(",")):
        for mode, name in enumerate(names):
            out = cp.zeros(nb, dtype=cp.uint64)
            stop = cp.zeros(1, dtype=cp.int32)
            k((nb,), (64,), (cp.uint64(hptr), dev, out, np.int32(mode), np.int32(a.iters), stop))
            cp.cuda.runtime.deviceSynchronize()
            v = out.get()
            print(f"blocks {nb:3d}  mode {mode} {name:<34} fence median ns: min {int(v.min())} max {int(v.max())}")
    cp.cuda.runtime.freeHost(hptr)


if __name__ == "__main__":
    main()
