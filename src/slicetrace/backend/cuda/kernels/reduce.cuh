// reduceCopy: up to two sources (FIFO slice, user input) combined with OP, written to up to two
// destinations (user output, the peer's FIFO). 16-byte vectors when every pointer has the same
// alignment modulo 16 (scalar head and tail around them); element by element otherwise.
#pragma once
#include "common.cuh"

template <typename T, int OP> struct Vec {
  enum { E = 16 / sizeof(T) };
  union U { uint4 v; T e[E]; };
  static __device__ __forceinline__ uint4 red(uint4 a, uint4 b) {
    U x, y; x.v = a; y.v = b;
#pragma unroll
    for (int i = 0; i < E; i++) x.e[i] = red1<T, OP>(x.e[i], y.e[i]);
    return x.v;
  }
  static __device__ __forceinline__ uint4 pms(uint4 a, typename Num<T>::A sc) {
    U x; x.v = a;
#pragma unroll
    for (int i = 0; i < E; i++) x.e[i] = pms1<T>(x.e[i], sc);
    return x.v;
  }
  static __device__ __forceinline__ uint4 div(uint4 a, int n) {
    U x; x.v = a;
#pragma unroll
    for (int i = 0; i < E; i++) x.e[i] = div1<T>(x.e[i], n);
    return x.v;
  }
};

// OP_PMS: s1 (the user's input, when there) is scaled; s0 too when pre0 (s0 is the user's input: a send of it).
template <typename T, int OP>
__device__ __forceinline__ T rc_elem(const T* s0, const T* s1, i64 i, bool div, bool pre0, int nranks,
                                     typename Num<T>::A sc) {
  T v = ld_cg(s0 + i);
  if (OP == OP_PMS && pre0) v = pms1<T>(v, sc);
  if (OP != OP_COPY && s1) v = red1<T, OP>(v, OP == OP_PMS ? pms1<T>(ld_cg(s1 + i), sc) : ld_cg(s1 + i));
  if (OP == OP_AVG && div) v = div1<T>(v, nranks);
  return v;
}

template <typename T, int OP>
__device__ __noinline__ void reduce_copy(const T* s0, const T* s1, T* d0, T* d1, i64 n, bool div, bool pre0,
                                         int nranks, int tid, int nthr) {
  typedef Vec<T, OP> V;
  const typename Num<T>::A sc = OP == OP_PMS ? pms_scale<T>(nranks) : (typename Num<T>::A)0;
  const u64 a0 = (u64)s0 & 15;
  const bool al = ((u64)d0 & 15) == a0 && (!s1 || ((u64)s1 & 15) == a0) && (!d1 || ((u64)d1 & 15) == a0);
  i64 head = n;
  if (al) {
    head = (i64)(((16 - a0) & 15) / sizeof(T));
    if (head > n) head = n;
  }
  for (i64 i = tid; i < head; i += nthr) {
    T v = rc_elem<T, OP>(s0, s1, i, div, pre0, nranks, sc);
    d0[i] = v;
    if (d1) d1[i] = v;
  }
  if (head == n) return;
  const i64 nv = (n - head) / V::E;
  const uint4* v0 = (const uint4*)(s0 + head);
  const uint4* v1 = s1 ? (const uint4*)(s1 + head) : 0;
  uint4* w0 = (uint4*)(d0 + head);
  uint4* w1 = d1 ? (uint4*)(d1 + head) : 0;
  const int U = 4;   // four 16-byte loads per source in flight per thread
  i64 i = tid;
  for (; i + (U - 1) * nthr < nv; i += U * nthr) {
    uint4 x[U], y[U];
#pragma unroll
    for (int u = 0; u < U; u++) x[u] = ld_cg_v4(v0 + i + u * nthr);
    if (OP == OP_PMS && pre0) {
#pragma unroll
      for (int u = 0; u < U; u++) x[u] = V::pms(x[u], sc);
    }
    if (OP != OP_COPY && v1) {
#pragma unroll
      for (int u = 0; u < U; u++) y[u] = ld_cg_v4(v1 + i + u * nthr);
      if (OP == OP_PMS) {
#pragma unroll
        for (int u = 0; u < U; u++) y[u] = V::pms(y[u], sc);
      }
#pragma unroll
      for (int u = 0; u < U; u++) x[u] = V::red(x[u], y[u]);
    }
    if (OP == OP_AVG && div) {
#pragma unroll
      for (int u = 0; u < U; u++) x[u] = V::div(x[u], nranks);
    }
#pragma unroll
    for (int u = 0; u < U; u++) st_v4(w0 + i + u * nthr, x[u]);
    if (w1) {
#pragma unroll
      for (int u = 0; u < U; u++) st_v4(w1 + i + u * nthr, x[u]);
    }
  }
  for (; i < nv; i += nthr) {
    uint4 x = ld_cg_v4(v0 + i);
    if (OP == OP_PMS && pre0) x = V::pms(x, sc);
    if (OP != OP_COPY && v1) x = V::red(x, OP == OP_PMS ? V::pms(ld_cg_v4(v1 + i), sc) : ld_cg_v4(v1 + i));
    if (OP == OP_AVG && div) x = V::div(x, nranks);
    st_v4(w0 + i, x);
    if (w1) st_v4(w1 + i, x);
  }
  for (i64 j = head + nv * V::E + tid; j < n; j += nthr) {
    T v = rc_elem<T, OP>(s0, s1, j, div, pre0, nranks, sc);
    d0[j] = v;
    if (d1) d1[j] = v;
  }
}

// redop is uniform per launch; one switch per slice picks the instantiation. pre0: s0 is the user's input.
template <typename T>
__device__ void reduce_copy_op(int redop, const T* s0, const T* s1, T* d0, T* d1, i64 n, bool div, bool pre0,
                               int nranks, int tid, int nthr) {
  enum { AVG = IsFloat<T>::v ? OP_PMS : OP_AVG };
  if (!s1) {
    if (AVG == OP_PMS && redop == OP_AVG && pre0) reduce_copy<T, AVG>(s0, 0, d0, d1, n, false, true, nranks, tid, nthr);
    else reduce_copy<T, OP_COPY>(s0, 0, d0, d1, n, false, false, nranks, tid, nthr);
    return;
  }
  switch (redop) {
    case OP_PROD: reduce_copy<T, OP_PROD>(s0, s1, d0, d1, n, div, false, nranks, tid, nthr); break;
    case OP_MIN: reduce_copy<T, OP_MIN>(s0, s1, d0, d1, n, div, false, nranks, tid, nthr); break;
    case OP_MAX: reduce_copy<T, OP_MAX>(s0, s1, d0, d1, n, div, false, nranks, tid, nthr); break;
    case OP_AVG: reduce_copy<T, AVG>(s0, s1, d0, d1, n, div, pre0, nranks, tid, nthr); break;
    default: reduce_copy<T, OP_SUM>(s0, s1, d0, d1, n, div, false, nranks, tid, nthr); break;
  }
}
