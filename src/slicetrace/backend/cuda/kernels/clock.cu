// Clock probe: m[0] go (host), m[1] ack (device), m[2] %globaltimer read between the two.
// The host brackets each round with CLOCK_MONOTONIC reads; a deadline keeps a lost host from hanging it.
#include "common.cuh"

extern "C" __global__ void st_clock(u64* m, int rounds, u64 deadline_ns) {
  if (threadIdx.x != 0) return;
  const u64 t0 = gtimer();
  st_volatile(m + 3, 1);                 // running
  for (int r = 1; r <= rounds; r++) {
    while (true) {
      u64 go;
      asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(go) : "l"(m) : "memory");
      if (go >= (u64)r) break;
      if (gtimer() - t0 > deadline_ns) return;
    }
    st_volatile(m + 2, gtimer());
    fence_sys();
    st_volatile(m + 1, (u64)r);
  }
}
