// Types, PTX helpers and element arithmetic. NVRTC has no standard headers, so nothing is included.
#pragma once

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#define ST_NCCL_STEPS 8
#define ST_MAXRANKS 64
#define ST_MAXP 64          // p2p parts per launch
#define ST_MAXB 64          // blocks (channels) per launch
#define ST_MAXG 15          // p2p programs per block (named barriers 1..15)
#ifndef ST_MAX_THREADS        // workers + the post warp; 4 warps per register file give 128 registers and no
#define ST_MAX_THREADS 512  // spills; 544 (17 warps) caps them at 96 and the stamped build spilled 1.5 KB
#endif
#define ST_ABORT_SPINS 1024 // spins between two looks at the abort words

enum { F_ALL_REDUCE = 0, F_ALL_GATHER, F_REDUCE_SCATTER, F_BROADCAST, F_REDUCE, F_SEND_RECV };
enum { OP_SUM = 0, OP_PROD, OP_MIN, OP_MAX, OP_AVG, OP_COPY, OP_PMS };   // PMS: avg of floating types

__device__ __forceinline__ u64 gtimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ u64 ld_acquire_sys(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ u32 ld_volatile_u32(const u32* p) {
  u32 v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed_sys(u64* p, u64 v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_volatile(u64* p, u64 v) {
  asm volatile("st.volatile.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_v2_u64(u64* p, u64 x, u64 y) {
  asm volatile("st.global.v2.u64 [%0], {%1,%2};" :: "l"(p), "l"(x), "l"(y) : "memory");
}
__device__ __forceinline__ void st_volatile_u32(u32* p, u32 v) {
  asm volatile("st.volatile.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void fence_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
// Not .aligned: the wait-role lanes of warp 0 arrive diverged.
__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("barrier.sync %0, %1;" :: "r"(id), "r"(n) : "memory");
}

// FIFO slots are rewritten by the peer every 8 steps: loads skip L1 (.cg) so no stale line is read.
__device__ __forceinline__ uint4 ld_cg_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_v4(void* p, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

template <int S> struct Raw;
template <> struct Raw<1> { typedef u8 U; };
template <> struct Raw<2> { typedef u16 U; };
template <> struct Raw<4> { typedef u32 U; };
template <> struct Raw<8> { typedef u64 U; };

template <typename T> __device__ __forceinline__ T ld_cg(const T* p) {
  typedef typename Raw<sizeof(T)>::U U;
  union { U u; T t; } r;
  if (sizeof(T) == 1) { u32 x; asm volatile("ld.global.cg.u8 %0, [%1];" : "=r"(x) : "l"(p) : "memory"); r.u = (U)x; }
  if (sizeof(T) == 2) { u16 x; asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(x) : "l"(p) : "memory"); r.u = (U)x; }
  if (sizeof(T) == 4) { u32 x; asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(x) : "l"(p) : "memory"); r.u = (U)x; }
  if (sizeof(T) == 8) { u64 x; asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(x) : "l"(p) : "memory"); r.u = (U)x; }
  return r.t;
}

// 16-bit floats are kept as raw bits; arithmetic happens in float.
struct h16 { u16 x; };
struct b16 { u16 x; };

__device__ __forceinline__ float h2f(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ u16 f2h(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float b2f(u16 b) { return __uint_as_float(((u32)b) << 16); }
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
__device__ __forceinline__ u16 f2b(float f) { u16 h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#else  // cvt to bf16 needs sm_80: round to nearest even by hand (a NaN stays a NaN, quiet)
__device__ __forceinline__ u16 f2b(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
  return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
#endif

template <typename T> struct Num { typedef T A; static __device__ A up(T x) { return x; } static __device__ T down(A a) { return a; } };
template <> struct Num<signed char> { typedef int A; static __device__ A up(signed char x) { return x; } static __device__ signed char down(A a) { return (signed char)a; } };
template <> struct Num<unsigned char> { typedef u32 A; static __device__ A up(unsigned char x) { return x; } static __device__ unsigned char down(A a) { return (unsigned char)a; } };
template <> struct Num<h16> { typedef float A; static __device__ A up(h16 x) { return h2f(x.x); } static __device__ h16 down(A a) { h16 r; r.x = f2h(a); return r; } };
template <> struct Num<b16> { typedef float A; static __device__ A up(b16 x) { return b2f(x.x); } static __device__ b16 down(A a) { b16 r; r.x = f2b(a); return r; } };

template <int OP, typename A> __device__ __forceinline__ A op2(A a, A b) {
  if (OP == OP_PROD) return a * b;
  // NCCL's fminf/fmaxf/__hmin: a NaN operand loses to a number (NaN only when both are), whichever rank has it
  if (OP == OP_MIN) return (b < a || a != a) ? b : a;
  if (OP == OP_MAX) return (a < b || a != a) ? b : a;
  return a + b;   // sum, avg (divided once, when the final value is written)
}
template <typename T, int OP> __device__ __forceinline__ T red1(T a, T b) {
  return Num<T>::down(op2<OP>(Num<T>::up(a), Num<T>::up(b)));
}
// NCCL's avg: floating types PreMulSum (each input times float(1.0/n) in the type as it enters the sum; a double
// scalar for double), integers SumPostDiv (the sum, divided once at the final write).
template <typename T> struct IsFloat { enum { v = 0 }; };
template <> struct IsFloat<float> { enum { v = 1 }; };
template <> struct IsFloat<double> { enum { v = 1 }; };
template <> struct IsFloat<h16> { enum { v = 1 }; };
template <> struct IsFloat<b16> { enum { v = 1 }; };
template <typename T> __device__ __forceinline__ typename Num<T>::A pms_scale(int n) {
  typedef typename Num<T>::A A;
  return Num<T>::up(Num<T>::down(sizeof(T) == 8 ? (A)(1.0 / n) : (A)(float)(1.0 / n)));
}
template <typename T> __device__ __forceinline__ T pms1(T a, typename Num<T>::A sc) {
  return Num<T>::down(Num<T>::up(a) * sc);
}
template <typename T> __device__ __forceinline__ T div1(T a, int n) {
  typedef typename Num<T>::A A;
  return Num<T>::down(Num<T>::up(a) / (A)n);
}
