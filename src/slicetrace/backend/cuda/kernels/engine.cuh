// Simple-protocol primitives for one warp group: wait (tid 0 recv, tid 1 send), copy (worker warps),
// post (the last thread; with >= 3 warps it sits in its own warp so its fence overlaps the next copy).
// Stamps (stamps/layout.py, GPU writer rules) cost no fence and no store to host memory: the host reserves
// each program's seq range at submit (Args.seq_base/seq_n) and the ring lives in this GPU's memory. The wait
// roles leave their clocks in shared memory; the post thread writes each record whole (wait, ready and done:
// one entry, three 16-byte stores) right after its tail store (and a KernelCh start after the first one), so
// no stamp store is in flight when a fence runs: a fence waits for them. Seq words are provisional; the drain
// copies a range to the host once its op completed.
#pragma once
#include "args.cuh"
#include "reduce.cuh"

// Measurement variants (scripts/bench_cuda.py --variants): ST_STORES 0 = no record at all (logic and clocks
// only); ST_DIAG bit 1: the wait roles take no clocks; ST_HOIST 0: the post thread loads the roles' clocks
// after its tail store; ST_TIMER 1: the wait roles read the SM's clock64 instead of %globaltimer (timing only:
// not on the host's timeline); ST_INLINE 0: slice() as a call (the engine state then lives in local memory:
// 3-5 us slower per op up to 16 MiB, docs/benchmarks.md).
#ifndef ST_STORES
#define ST_STORES 1
#endif
#ifndef ST_TIMER
#define ST_TIMER 0
#endif
#ifndef ST_HOIST
#define ST_HOIST 1
#endif
#ifndef ST_DIAG
#define ST_DIAG 0
#endif
#ifndef ST_INLINE
#define ST_INLINE 1
#endif
#if ST_INLINE
#define ST_SLICE_FN __forceinline__
#else
#define ST_SLICE_FN __noinline__
#endif

struct GrpShared {
  int ab[2][2];       // [slice parity][recv waiter, send waiter]: the wait was aborted
  u64 clk[2][2][2];   // [slice parity][recv, send][wait, ready]: the wait roles' clocks for the post thread
};

struct Grp { int tid, nthr, nwork, bar_all, bar_work, post; };

struct Conn {
  char* s_fifo; u64* s_tail; const u64* s_head; u64* s_stepp; int s_peer;
  const char* r_fifo; const u64* r_tail; u64* r_head; u64* r_stepp; int r_peer;
};

__device__ __forceinline__ void conn_send(Conn& c, const Comm* cm, int ch, int peer) {
  const int w = cm->world, me = cm->rank;
  const int kl = ch * (w - 1) + peer_slot(me, peer, w), kr = ch * (w - 1) + peer_slot(peer, me, w);
  const u64 rb = cm->peer_base[peer], lb = cm->peer_base[me];
  c.s_fifo = (char*)(rb + cm->fifo_off + (u64)kr * cm->buffsize);
  c.s_tail = (u64*)(rb + tail_off(kr));
  c.s_head = (const u64*)(lb + head_off(cm, kl));
  c.s_stepp = (u64*)cm->send_step + kl;
  c.s_peer = peer;
}
__device__ __forceinline__ void conn_recv(Conn& c, const Comm* cm, int ch, int peer) {
  const int w = cm->world, me = cm->rank;
  const int kl = ch * (w - 1) + peer_slot(me, peer, w), kr = ch * (w - 1) + peer_slot(peer, me, w);
  const u64 rb = cm->peer_base[peer], lb = cm->peer_base[me];
  c.r_fifo = (const char*)(lb + cm->fifo_off + (u64)kl * cm->buffsize);
  c.r_tail = (const u64*)(lb + tail_off(kl));
  c.r_head = (u64*)(rb + head_off(cm, kr));
  c.r_stepp = (u64*)cm->recv_step + kl;
  c.r_peer = peer;
}

__device__ __forceinline__ int check_abort(const Comm* cm) {
  return (int)(ld_volatile_u32((const u32*)cm->abort_host) | ld_volatile_u32((const u32*)cm->peer_base[cm->rank]));
}
// Spin until *p + add >= target; 1 if an abort word was raised meanwhile.
__device__ __forceinline__ int spin_until(const u64* p, u64 add, u64 target, const Comm* cm) {
  int n = 0;
  while (ld_acquire_sys(p) + add < target) {
    if (++n == ST_ABORT_SPINS) {
      n = 0;
      if (check_abort(cm)) return 1;
    }
  }
  return 0;
}

__device__ __forceinline__ u64 id0(u32 op, u64 step) { return (u64)op | ((step & 0xFFFFFFFFull) << 32); }
__device__ __forceinline__ u64 id1(u64 size, int peer, int kind, int flags) {
  return (size & 0xFFFFFFFFull) | ((u64)(u16)peer << 32) | ((u64)kind << 48) | ((u64)flags << 56);
}

template <typename T, bool STEPS> struct Eng {
  const Args* a; const Comm* cm; GrpShared* gs;
  Grp g; Conn c;
  u64 sstep, rstep;
  int krs, kss;          // receive / send slice index of the program modulo the sample rate, per direction so the
                         // peer keeps the same slices (plan.traffic.stamp_records; counters: a modulo by
                         // a runtime divisor sat before every wait, ~1 % per op up to 16 MiB)
  int kr;                // real (non-empty) slices so far: parity of the shared abort slots
  bool aborted;
  // stamp state, the same in every thread (every thread runs the same slices)
  u64* rg; u64 mask, tag;
  u32 seq, left;         // next seq of this program's reserved range, and how many of it remain
  u32 chq;               // KernelCh start seq (the stop is chq + 1), when chon
  bool chon, chpend;     // chpend: the start record (clock cht) is not written yet
  bool chlap;            // the program's range laps its stop: the stop's slot holds a newer step
  u64 cht;
  int ch_peer, ch_flags;

  __device__ u64* slot(u32 q) const { return rg + (u64)(q & mask) * 6; }

  __device__ bool post() const { return g.tid == g.post; }

  // One whole entry [seq, wait, ready, done, id0, id1] (48 B) as three 16-byte stores.
  __device__ void put(u64* p, u64 w0, u64 w1, u64 w2, u64 w3, u64 i0, u64 i1) const {
    if (!ST_STORES) return;
    st_v2_u64(p, w0, w1);
    st_v2_u64(p + 2, w2, w3);
    st_v2_u64(p + 4, i0, i1);
  }
  // A KernelCh start or stop record at seq q: clock t as wait, ready and done (post thread).
  __device__ void put_ch(u32 q, u64 t, int stop) const {
    put(slot(q), tag | q, t, t, t, id0(a->op_tag, 0), id1(0, ch_peer, 1, ch_flags | (stop ? 2 : 0)));
  }

  __device__ void init(const Args* a_, const Comm* cm_, GrpShared* gs_, Grp g_, int ch, int prog) {
    a = a_; cm = cm_; gs = gs_; g = g_;
    c.s_stepp = 0; c.r_stepp = 0; c.s_peer = c.r_peer = 0;
    rg = (u64*)cm->ring + (u64)ch * cm->slots * 6;
    mask = cm->slots - 1;
    tag = (1ull << 63) | ((u64)(a->op_tag & 0x7FFFFFFFu) << 32);
    seq = a->seq_base[prog]; left = a->seq_n[prog];
    aborted = false; krs = 0; kss = 0; kr = 0;
  }
  __device__ static u64 round_up(u64 s, int m) { return (s + m - 1) / m * m; }

  __device__ void begin(int peer, int flags) {
    // A kernel queued behind one that aborted would start on the counters that one did not save: its first waits
    // could pass on stale credit and write over a peer's FIFO. One thread reads this device's abort word (the
    // aborted kernel set it), all agree; the second barrier frees the slot for slice 0.
    if (g.tid == 0) gs->ab[0][0] = (int)ld_volatile_u32((const u32*)cm->peer_base[cm->rank]);
    bar_sync(g.bar_all, g.nthr);
    aborted = gs->ab[0][0] != 0;
    bar_sync(g.bar_all, g.nthr);
    chon = chpend = false;
    if (aborted) return;
    sstep = c.s_stepp ? round_up(*c.s_stepp, a->chunk_steps) : 0;
    rstep = c.r_stepp ? round_up(*c.r_stepp, a->chunk_steps) : 0;
    // NCCL's PostRecv: return credit for the steps the rounding skipped at once. Without it, two connections
    // both left off a chunk boundary (broadcast then reduce, then all_reduce) wait on each other's credit.
    if (post() && c.r_stepp && rstep != *c.r_stepp) st_relaxed_sys(c.r_head, rstep);
    ch_peer = peer; ch_flags = flags;
    // KernelCh start = seq_base, stop = seq_base + 1 (stamps.layout: reserved together before the slices)
    chon = a->stamp_ch && left >= 2;
    if (chon) {
      chlap = (u64)left > mask + 2;   // seq chq + 1 + slots is in the range: the stop would overwrite one of the
                                      // newest steps (one record past the ring laps the start only)
      chq = seq; seq += 2; left -= 2;
      if (post()) { cht = gtimer(); chpend = true; }   // written after the first tail store (no fence waits)
    }
  }
  __device__ void end() {
    if (!post()) return;
    if (chpend) put_ch(chq, cht, 0);
    if (chon && !chlap) put_ch(chq + 1, gtimer(), 1);   // no fence: the op's completion makes these visible
    if (!aborted) {
      if (c.s_stepp) *c.s_stepp = sstep;
      if (c.r_stepp) *c.r_stepp = rstep;
    } else {
      st_volatile_u32((u32*)cm->status_host, 1u);
      st_volatile_u32((u32*)cm->peer_base[cm->rank], 1u);   // the kernels queued behind it see it at begin
    }
  }

  __device__ static u64 rclock() { return ST_TIMER ? (u64)clock64() : gtimer(); }

  // A wait role (tid 0: recv, tid 1: send): its clocks go to shared memory, for the post thread to write.
  __device__ int role_wait(const u64* p, u64 add, u64 target, bool rec, int dir, int par) {
    const bool clk = STEPS && rec && !(ST_DIAG & 1);
    const u64 tw = clk ? rclock() : 0;
    const int ab = spin_until(p, add, target, cm);
    if (clk) { gs->clk[par][dir][0] = tw; gs->clk[par][dir][1] = rclock(); }
    return ab;
  }

  // One slice of n elements. src/dst are user pointers at the slice (0 = unused).
  __device__ ST_SLICE_FN void slice(bool rv, bool sd, const T* src, T* dst, bool red, bool fin, i64 n, int ss) {
    const int par = kr & 1;   // only real slices pass barriers, so only they may flip the slot
    if (n > 0) {
      const bool kr0 = STEPS && rv && krs == 0, ks0 = STEPS && sd && kss == 0;
      const u32 nd = (u32)kr0 + (u32)ks0;
      const bool rec = STEPS && nd > 0 && left >= nd;
      const bool recr = rec && kr0, recs = rec && ks0;
      const u32 q = seq;      // recv record at q, send record after it
      if (rec) { seq += nd; left -= nd; }
      if (g.tid == 0) gs->ab[par][0] = rv ? role_wait(c.r_tail, 0, rstep + ss, recr, 0, par) : 0;
      if (g.tid == 1) gs->ab[par][1] = sd ? role_wait(c.s_head, ST_NCCL_STEPS, sstep + ss, recs, 1, par) : 0;
      if (g.tid < g.nwork) {
        bar_sync(g.bar_work, g.nwork);
        if (!(gs->ab[par][0] | gs->ab[par][1])) {
          const T* rf = rv ? (const T*)(c.r_fifo + (rstep % ST_NCCL_STEPS) * a->step_bytes) : 0;
          T* sf = sd ? (T*)(c.s_fifo + (sstep % ST_NCCL_STEPS) * a->step_bytes) : 0;
          const T* s0 = rv ? rf : src;
          const T* s1 = (rv && red) ? src : 0;
          T* d0 = dst ? dst : sf;
          T* d1 = dst ? sf : 0;
          reduce_copy_op<T>(a->redop, s0, s1, d0, d1, n, fin, !rv && src, a->nranks, g.tid, g.nwork);
        }
      }
      // The post thread readies its entries while it waits for the workers: after its fence and tail store
      // only the stores remain, and no stamp store is in flight when a fence runs.
      u64 *cr = 0, *cs = 0, wr = 0, ws = 0, r4 = 0, r5 = 0, s4 = 0, s5 = 0;
      if (STEPS && rec && post()) {
        const u64 sz = (u64)n * sizeof(T);
        if (recr) { cr = slot(q); wr = tag | q; r4 = id0(a->op_tag, rstep); r5 = id1(sz, c.r_peer, 0, 0); }
        if (recs) {
          cs = slot(q + recr); ws = tag | (q + recr); s4 = id0(a->op_tag, sstep); s5 = id1(sz, c.s_peer, 0, 1);
        }
      }
      bar_sync(g.bar_all, g.nthr);
      if (gs->ab[par][0] | gs->ab[par][1]) { aborted = true; return; }
      if (post()) {
        // The roles' clocks are loaded before the fence, so the stores after the tail store wait for nothing.
        const bool clk = !(ST_DIAG & 1), early = STEPS && rec && clk && ST_HOIST;
        const u64 c0 = early && cr ? gs->clk[par][0][0] : 0, c1 = early && cr ? gs->clk[par][0][1] : 0;
        const u64 c2 = early && cs ? gs->clk[par][1][0] : 0, c3 = early && cs ? gs->clk[par][1][1] : 0;
        const u64 td = STEPS && rec ? gtimer() : 0;   // done is read before the tail store
        fence_sys();                                  // slice data (all workers, via the barrier) first
        if (sd) st_relaxed_sys(c.s_tail, sstep + ss);
        if (rv) st_relaxed_sys(c.r_head, rstep + ss);
        if (STEPS && chpend) { put_ch(chq, cht, 0); chpend = false; }
        if (STEPS && rec) {                           // behind the tail store: nothing waits for them
          const bool late = clk && !ST_HOIST;
          if (cr) put(cr, wr, late ? gs->clk[par][0][0] : c0, late ? gs->clk[par][0][1] : c1, td, r4, r5);
          if (cs) put(cs, ws, late ? gs->clk[par][1][0] : c2, late ? gs->clk[par][1][1] : c3, td, s4, s5);
        }
      }
      kr++;
    } else if (post()) {                              // empty slice: no data, but steps stay in lockstep
      if (sd) st_relaxed_sys(c.s_tail, sstep + ss);
      if (rv) st_relaxed_sys(c.r_head, rstep + ss);
    }
    if (rv) rstep += ss;
    if (sd) sstep += ss;
    if (STEPS && rv) krs = krs + 1 == a->sample_rate ? 0 : krs + 1;
    if (STEPS && sd) kss = kss + 1 == a->sample_rate ? 0 : kss + 1;
  }

  // One primitive call (NCCL genericOp): slice geometry as plan.schedule.slice_layout.
  __device__ void prim(int rvp, int sdp, const T* src, T* dst, bool red, bool fin, i64 nelem) {
    if (aborted) return;
    const int ss = a->slice_steps, spc = a->chunk_steps / a->slice_steps;
    const i64 step_elems = a->step_bytes / (i64)sizeof(T);
    i64 size = (nelem + 16 * spc - 1) / (16 * spc) * 16;
    if (size < step_elems * ss / 32) size = step_elems * ss / 32;
    if (size > step_elems * ss) size = step_elems * ss;
    i64 off = 0;
    for (int s = 0; s < spc && !aborted; s++) {
      i64 n = nelem - off < size ? nelem - off : size;
      if (n < 0) n = 0;
      slice(rvp >= 0, sdp >= 0, src ? src + off : 0, dst ? dst + off : 0, red, fin, n, ss);
      off += n;
    }
  }
};
