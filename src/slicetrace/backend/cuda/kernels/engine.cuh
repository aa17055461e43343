// Simple-protocol primitives for one warp group: wait (tid 0 recv, tid 1 send), copy (worker warps),
// post (the last thread; with >= 3 warps it sits in its own warp so its fence overlaps the next copy).
// With STEPS the post thread also writes the KernelStep stamps (stamps/layout.py), publishing each
// slice's seq numbers at the next slice's fence, so stamping adds stores but no fence per slice.
#pragma once
#include "args.cuh"
#include "reduce.cuh"

#ifndef ST_STAMP_WRITES
#define ST_STAMP_WRITES 1
#endif
// ST_TIMER_MODE 0: every stamp clock is a %globaltimer read (16 ns a read on H200, measured). Mode 1 (an
// option for GPUs where that read is slow): the wait roles take clock64() and the post thread reads
// %globaltimer once per slice; wait/ready = done - cycles x the SM clock rate measured over that slice.
#ifndef ST_TIMER_MODE
#define ST_TIMER_MODE 0
#endif
__device__ __forceinline__ u64 role_clock() { return ST_TIMER_MODE ? (u64)clock64() : gtimer(); }

struct GrpShared {
  u64 clk[2][2][2];   // [slice parity][recv, send][wait, ready]
  int ab[2][2];       // [slice parity][recv waiter, send waiter]: the wait was aborted
};
struct BlockShared {
  GrpShared g[ST_MAXG];
  u64 reserved, sampled;   // this channel's stamp counters (mirrored into the ring header)
  int lock, multi;
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
  const Args* a; const Comm* cm; BlockShared* bs; GrpShared* gs;
  Grp g; Conn c;
  u64 sstep, rstep;
  int k;                 // slice index within the program (sampling)
  int kr;                // real (non-empty) slices so far: parity of the shared clock/abort slots
  bool aborted;
  // stamp state, used by the post thread only
  u64 *hdr, *st, *co; u64 mask;
  u64 pend_lo, pend_hi;  // step entries whose payload is written and seq not yet published
  u64 chseq; bool ch_pend;
  int ch_peer, ch_flags;
  u64 pt, pc;            // last (%globaltimer, clock64) pair: the SM clock's rate over the current slice

  __device__ bool post() const { return g.tid == g.post; }
  __device__ bool stamping() const { return STEPS || a->stamp_ch; }

  __device__ void lock() { if (bs->multi) { while (atomicCAS(&bs->lock, 0, 1) != 0) {} __threadfence_block(); } }
  __device__ void unlock() { if (bs->multi) { fence_sys(); atomicExch(&bs->lock, 0); } }
  __device__ u64 reserve(int n) {
    volatile u64* r = &bs->reserved;
    lock();
    const u64 q = *r + 1;
    *r = q + n - 1;
    st_volatile(hdr, q + n - 1);         // header.reserved, before any payload of these seqs
    unlock();
    return q;
  }
  __device__ void sampled_out(int n) {
    volatile u64* s = &bs->sampled;
    lock();
    *s = *s + n;
    st_volatile(hdr + 1, *s);
    unlock();
  }
  __device__ void entry(u64* ring, u64 q, u64 w, u64 r, u64 d, u64 i0, u64 i1) {
    if (ST_STAMP_WRITES == 0) return;    // measurement variant: stamping logic without the ring stores
    u64* e = ring + (q & mask) * 6;
    st_volatile(e + 1, w); st_volatile(e + 2, r); st_volatile(e + 3, d);
    st_volatile(e + 4, i0); st_volatile(e + 5, i1);
  }
  __device__ void publish() {
    for (u64 q = pend_lo; q < pend_hi; q++) {
      st_volatile(st + (q & mask) * 6, q);
      st_volatile(co + (q & mask) * 6, q);
    }
    pend_lo = pend_hi;
    if (ch_pend) { st_volatile(st + (chseq & mask) * 6, chseq); st_volatile(co + (chseq & mask) * 6, chseq); ch_pend = false; }
  }

  __device__ void init(const Args* a_, const Comm* cm_, BlockShared* bs_, int gi, Grp g_, int ch) {
    a = a_; cm = cm_; bs = bs_; gs = &bs_->g[gi]; g = g_;
    c.s_stepp = 0; c.r_stepp = 0; c.s_peer = c.r_peer = 0;
    hdr = (u64*)cm->stamp_hdr + (u64)ch * 8;
    st = (u64*)cm->started + (u64)ch * cm->slots * 6;
    co = (u64*)cm->completed + (u64)ch * cm->slots * 6;
    mask = cm->slots - 1;
    pend_lo = pend_hi = 0; ch_pend = false; aborted = false; k = 0; kr = 0;
  }
  __device__ static u64 round_up(u64 s, int m) { return (s + m - 1) / m * m; }

  __device__ bool last_warp() const { return g.tid >= g.nthr - 32; }
  __device__ void begin(int peer, int flags) {
    sstep = c.s_stepp ? round_up(*c.s_stepp, a->chunk_steps) : 0;
    rstep = c.r_stepp ? round_up(*c.r_stepp, a->chunk_steps) : 0;
    // NCCL's PostRecv: return credit for the steps the rounding skipped at once. Without it, two connections
    // both left off a chunk boundary (broadcast then reduce, then all_reduce) wait on each other's credit.
    if (post() && c.r_stepp && rstep != *c.r_stepp) st_relaxed_sys(c.r_head, rstep);
    ch_peer = peer; ch_flags = flags;
    if (STEPS && ST_TIMER_MODE && post()) { pc = clock64(); pt = gtimer(); }
    if (a->stamp_ch && last_warp()) {
      if (post()) {
        // KernelCh start: a record of its own, completed at once (stamps/layout.py: an entry left open across
        // many later seqs would have its completed slot reused). Published at the first slice's fence.
        const u64 t = gtimer();
        chseq = reserve(1);
        fence_sys();                    // header.reserved before the payload: a lapping reader must see it
        entry(st, chseq, t, t, 0, id0(a->op_tag, 0), id1(0, peer, 1, flags));
        entry(co, chseq, 0, 0, t, id0(a->op_tag, 0), id1(0, peer, 1, flags));
      }
      chseq = __shfl_sync(0xffffffffu, chseq, 31);   // the whole last warp tracks the stamp state
      ch_pend = true;
    }
  }
  __device__ void end() {
    if (!last_warp()) return;
    __syncwarp();                      // payload stores of the warp's lanes come before the final fence
    if (!post()) return;
    if (!aborted) {
      if (c.s_stepp) *c.s_stepp = sstep;
      if (c.r_stepp) *c.r_stepp = rstep;
    } else {
      st_volatile_u32((u32*)cm->status_host, 1u);
    }
    if (!stamping()) return;
    u64 q = 0;
    if (a->stamp_ch) {                  // KernelCh stop: its own seq, reserved after every slice of the program
      const u64 t = gtimer();
      q = reserve(1);
      fence_sys();                      // header.reserved before the payload (see begin)
      entry(st, q, t, t, 0, id0(a->op_tag, 0), id1(0, ch_peer, 1, ch_flags | 2));
      entry(co, q, 0, 0, t, id0(a->op_tag, 0), id1(0, ch_peer, 1, ch_flags | 2));
    }
    fence_sys();
    publish();
    if (a->stamp_ch) { st_volatile(st + (q & mask) * 6, q); st_volatile(co + (q & mask) * 6, q); }
  }

  // A role clock taken before the post thread's (cd cycles, td ns) pair, as %globaltimer ns.
  __device__ u64 ns_at(u64 c, u64 cd, u64 td, u64 rq16) const {
    if (!ST_TIMER_MODE) return c;
    const u64 dc = cd > c ? cd - c : 0;
    const u64 dn = (dc * rq16) >> 16;
    return dn < td ? td - dn : 0;
  }

  // Called by the group's last warp after the barrier: lane 31 posts; with STEPS the 32 lanes then write
  // the stamp words in parallel (one store each; a single thread's stores to host memory queue up).
  __device__ void post_real(bool rv, bool sd, i64 n, int ss, bool stamp, int par) {
    const int lane = g.tid & 31;
    u64 td = 0, cd = 0, q = 0, rq = 0;
    const int nd = (int)rv + (int)sd;
    if (lane == 31) {
      if (STEPS) {
        if (stamp) {                                   // done is read before the tail store
          cd = clock64(); td = gtimer(); q = reserve(nd);
          rq = cd - pc > 2000 && td > pt ? ((td - pt) << 16) / (cd - pc) : (u64)a->cyc_q16;
          pt = td; pc = cd;
        } else {
          sampled_out(nd);
        }
      }
      fence_sys();                                     // slice data (all workers, via the barrier) first
      if (sd) st_relaxed_sys(c.s_tail, sstep + ss);
      if (rv) st_relaxed_sys(c.r_head, rstep + ss);
    }
    if (!STEPS) return;
    __syncwarp();
    // publish the previous slice: its payload was written before this slice's barrier and fence
    const int np = (int)(pend_hi - pend_lo);
    if (lane < 2 * np) {
      const u64 pq = pend_lo + (lane >> 1);
      st_volatile(((lane & 1) ? co : st) + (pq & mask) * 6, pq);
    }
    if (ch_pend && lane == 30) st_volatile(st + (chseq & mask) * 6, chseq);
    if (ch_pend && lane == 29) st_volatile(co + (chseq & mask) * 6, chseq);
    ch_pend = false;
    pend_lo = pend_hi;
    if (!stamp) return;
    td = __shfl_sync(0xffffffffu, td, 31); cd = __shfl_sync(0xffffffffu, cd, 31);
    q = __shfl_sync(0xffffffffu, q, 31); rq = __shfl_sync(0xffffffffu, rq, 31);
    if (lane < 10 * nd) {
      const int e = lane / 10, ring = (lane % 10) / 5, w = lane % 5 + 1;
      const bool recv = rv && e == 0;
      const int dir = recv ? 0 : 1;
      const u64 step = recv ? rstep : sstep;
      u64 v;
      if (w == 1) v = ring ? 0 : ns_at(gs->clk[par][dir][0], cd, td, rq);
      else if (w == 2) v = ring ? 0 : ns_at(gs->clk[par][dir][1], cd, td, rq);
      else if (w == 3) v = ring ? td : 0;
      else if (w == 4) v = id0(a->op_tag, step);
      else v = id1((u64)n * sizeof(T), recv ? c.r_peer : c.s_peer, 0, recv ? 0 : 1);
      if (ST_STAMP_WRITES) st_volatile((ring ? co : st) + ((q + e) & mask) * 6 + w, v);
    }
    pend_lo = q;
    pend_hi = q + nd;
  }

  // One slice of n elements. src/dst are user pointers at the slice (0 = unused).
  __device__ __noinline__ void slice(bool rv, bool sd, const T* src, T* dst, bool red, bool fin, i64 n, int ss) {
    const int par = kr & 1;   // only real slices pass barriers, so only they may flip the slot
    const bool stamp = STEPS && (k % a->sample_rate) == 0;
    if (n > 0) {
      if (g.tid == 0) {
        int ab = 0;
        if (rv) {
          const u64 tw = STEPS ? role_clock() : 0;
          ab = spin_until(c.r_tail, 0, rstep + ss, cm);
          if (STEPS) { gs->clk[par][0][0] = tw; gs->clk[par][0][1] = role_clock(); }
        }
        gs->ab[par][0] = ab;
      }
      if (g.tid == 1) {
        int ab = 0;
        if (sd) {
          const u64 tw = STEPS ? role_clock() : 0;
          ab = spin_until(c.s_head, ST_NCCL_STEPS, sstep + ss, cm);
          if (STEPS) { gs->clk[par][1][0] = tw; gs->clk[par][1][1] = role_clock(); }
        }
        gs->ab[par][1] = ab;
      }
      if (g.tid < g.nwork) {
        bar_sync(g.bar_work, g.nwork);
        if (!(gs->ab[par][0] | gs->ab[par][1])) {
          const T* rf = rv ? (const T*)(c.r_fifo + (rstep % ST_NCCL_STEPS) * a->step_bytes) : 0;
          T* sf = sd ? (T*)(c.s_fifo + (sstep % ST_NCCL_STEPS) * a->step_bytes) : 0;
          const T* s0 = rv ? rf : src;
          const T* s1 = (rv && red) ? src : 0;
          T* d0 = dst ? dst : sf;
          T* d1 = dst ? sf : 0;
          reduce_copy_op<T>(a->redop, s0, s1, d0, d1, n, fin, a->nranks, g.tid, g.nwork);
        }
      }
      bar_sync(g.bar_all, g.nthr);
      if (gs->ab[par][0] | gs->ab[par][1]) { aborted = true; return; }
      if (last_warp()) post_real(rv, sd, n, ss, stamp, par);
      kr++;
    } else if (post()) {                              // empty slice: no data, but steps stay in lockstep
      if (sd) st_relaxed_sys(c.s_tail, sstep + ss);
      if (rv) st_relaxed_sys(c.r_head, rstep + ss);
    }
    if (rv) rstep += ss;
    if (sd) sstep += ss;
    k++;
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
