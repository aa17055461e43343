// slicetrace collective kernel: one block per channel, NCCL runRing schedules (plan/schedule.py) rebuilt
// on the device from a few numbers. Compiled once per element type (ST_T) and KernelStep on/off (ST_STEPS).
#include "engine.cuh"

template <typename T> __device__ __forceinline__ i64 align_elems() { return 16 / sizeof(T) ? 16 / sizeof(T) : 1; }

template <typename T, bool STEPS>
__device__ void ring_program(Eng<T, STEPS>& e, const Args& a, i64 lo, i64 cnt) {
  const int n = a.nranks, r = a.rank, nxt = (r + 1) % n, prv = (r - 1 + n) % n;
  const T* in = (const T*)a.sendbuf;
  T* out = (T*)a.recvbuf;
  const i64 chunk = a.chunk_elems, count = a.count;
  if (a.func == F_ALL_REDUCE) {
    const i64 loop = (i64)n * chunk;
    for (i64 eoff = 0; eoff < cnt && !e.aborted; eoff += loop) {
      const i64 rem = cnt - eoff;
      const i64 al = align_elems<T>();
      const i64 cc = rem >= loop ? chunk : ((rem + n - 1) / n + al - 1) / al * al;
#define AT(ci) i64 o = eoff + (i64)(ci) * cc; i64 m = cnt - o < cc ? cnt - o : cc; if (m < 0) m = 0; o += lo;
      { AT((r + n - 1) % n) e.prim(-1, nxt, in + o, 0, false, false, m); }
      for (int j = 2; j < n; j++) { AT((r + n - j) % n) e.prim(prv, nxt, in + o, 0, true, false, m); }
      { AT(r) e.prim(prv, nxt, in + o, out + o, true, true, m); }
      for (int j = 1; j < n - 1; j++) { AT((r + n - j) % n) e.prim(prv, nxt, 0, out + o, false, false, m); }
      { AT((r + 1) % n) e.prim(prv, -1, 0, out + o, false, false, m); }
#undef AT
    }
    return;
  }
  for (i64 eoff = 0; eoff < cnt && !e.aborted; eoff += chunk) {
    const i64 m = cnt - eoff < chunk ? cnt - eoff : chunk;
    const i64 off = lo + eoff;
    if (a.func == F_ALL_GATHER) {
      e.prim(-1, nxt, in + off, out + (i64)r * count + off, false, false, m);
      for (int j = 1; j < n - 1; j++) e.prim(prv, nxt, 0, out + (i64)((r - j + n) % n) * count + off, false, false, m);
      e.prim(prv, -1, 0, out + (i64)((r + 1) % n) * count + off, false, false, m);
    } else if (a.func == F_REDUCE_SCATTER) {
      e.prim(-1, nxt, in + (i64)((r - 1 + n) % n) * count + off, 0, false, false, m);
      for (int j = 2; j < n; j++) e.prim(prv, nxt, in + (i64)((r - j + n) % n) * count + off, 0, true, false, m);
      e.prim(prv, -1, in + (i64)r * count + off, out + off, true, true, m);
    } else {
      const int pos = (r - a.root + n) % n;
      if (a.func == F_BROADCAST) {
        if (pos == 0) e.prim(-1, nxt, in + off, out + off, false, false, m);
        else if (pos == n - 1) e.prim(prv, -1, 0, out + off, false, false, m);
        else e.prim(prv, nxt, 0, out + off, false, false, m);
      } else {
        if (pos == 1) e.prim(-1, nxt, in + off, 0, false, false, m);
        else if (pos == 0) e.prim(prv, -1, in + off, out + off, true, true, m);
        else e.prim(prv, nxt, in + off, 0, true, false, m);
      }
    }
  }
}

template <typename T, bool STEPS>
__device__ void st_main(const Args& a) {
  __shared__ GrpShared gsh[ST_MAXG];
  const int b = blockIdx.x, nthr = blockDim.x;
  const bool p2p = a.func == F_SEND_RECV;
  const int G = p2p ? a.blk_n[b] : 1;
  const int first = p2p ? a.blk_first[b] : 0;
  const int ch = p2p ? a.parts[first].channel : b;
  const Comm* cm = (const Comm*)a.comm;
  // warp groups: the whole block for a ring; for p2p one group per program of this channel
  const int nw = nthr / 32, wpg = G <= 7 ? nw / G : 1;
  const int gi = (threadIdx.x / 32) / wpg;
  if (gi < G) {
    Grp g;
    g.nthr = wpg * 32;
    g.tid = threadIdx.x - gi * g.nthr;
    const bool has_post = G <= 7 && g.nthr >= 96;
    g.nwork = has_post ? g.nthr - 32 : g.nthr;
    g.bar_all = G <= 7 ? 2 * gi + 1 : gi + 1;
    g.bar_work = has_post ? g.bar_all + 1 : g.bar_all;
    g.post = g.nthr - 1;
    Eng<T, STEPS> e;
    e.init(&a, cm, &gsh[gi], g, ch, p2p ? first + gi : b);
    if (!p2p) {
      const int n = a.nranks;
      conn_send(e.c, cm, b, (a.rank + 1) % n);
      conn_recv(e.c, cm, b, (a.rank - 1 + n) % n);
      const i64 lo = (i64)b * a.per_ch;
      const i64 cnt = a.count - lo < a.per_ch ? a.count - lo : a.per_ch;
      e.begin(0, 0);
      ring_program<T, STEPS>(e, a, lo, cnt);
      e.end();
    } else {
      const P2pDesc& d = a.parts[first + gi];
      if (d.is_send) conn_send(e.c, cm, d.conn, d.peer);
      else conn_recv(e.c, cm, d.conn, d.peer);
      e.begin(d.peer, d.is_send ? 1 : 0);
      T* ptr = (T*)d.ptr;
      for (i64 off = 0; off < d.count && !e.aborted; off += a.chunk_elems) {
        const i64 m = d.count - off < a.chunk_elems ? d.count - off : a.chunk_elems;
        if (d.is_send) e.prim(-1, d.peer, ptr + off, 0, false, false, m);
        else e.prim(d.peer, -1, 0, ptr + off, false, false, m);
      }
      e.end();
    }
  }
}

#ifndef ST_T
#define ST_T float
#endif
#ifndef ST_STEPS
#define ST_STEPS 0
#endif
extern "C" __global__ void __launch_bounds__(ST_MAX_THREADS, 1) st_kernel(const __grid_constant__ Args a) {
  st_main<ST_T, ST_STEPS != 0>(a);
}
