// Simple-protocol primitives for one warp group: wait (tid 0 recv, tid 1 send), copy (worker warps),
// post (the last thread; with >= 3 warps it sits in its own warp so its fence overlaps the next copy).
// Stamps (stamps/layout.py, GPU writer rules) cost no fence and no store to host memory on the data path:
// the host reserves each program's seq range at submit (Args.seq_base/seq_n), the last warp stages records
// in shared memory and writes them out in bursts (at program end, or when the stage is full) with
// provisional seq words that the drain trusts once the op's completion event has fired. A fence waits for
// the PCIe writes in flight, so stores left pending in front of the data fences were most of the cost.
#pragma once
#include "args.cuh"
#include "reduce.cuh"

// ST_TIMER_MODE 0: every stamp clock is a %globaltimer read (16 ns a read on H200, measured). Mode 1 (an
// option for GPUs where that read is slow): the wait roles take clock64() and the post thread reads
// %globaltimer once per slice; wait/ready = done - cycles x the SM clock rate measured over that slice.
// ST_HOST_STORES 0: a measurement variant with no stamp store to host memory at all (logic cost only).
#ifndef ST_HOST_STORES
#define ST_HOST_STORES 1
#endif
// ST_DIAG bits, measurement variants too: 1 = the wait roles take no clocks, 2 = slices stage no records.
#ifndef ST_DIAG
#define ST_DIAG 0
#endif
#ifndef ST_TIMER_MODE
#define ST_TIMER_MODE 0
#endif
__device__ __forceinline__ u64 role_clock() { return ST_TIMER_MODE ? (u64)clock64() : gtimer(); }

#ifndef ST_STAGE
#define ST_STAGE 24          // stamp records a program stages in shared memory before writing them out
#endif
struct GrpShared {
  u64 clk[2][2][2];   // [slice parity][recv, send][wait, ready]
  int ab[2][2];       // [slice parity][recv waiter, send waiter]: the wait was aborted
  u64 stage[ST_STAGE][6];
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
  int k;                 // slice index within the program (sampling)
  int kr;                // real (non-empty) slices so far: parity of the shared clock/abort slots
  bool aborted;
  // stamp state, tracked by the whole last warp (warp-uniform)
  u64 *st, *co; u64 mask;
  u32 seq, seq_end;      // next seq of this program's reserved range [seq_base, seq_base + seq_n)
  u32 chq;               // KernelCh start seq (the stop is chq + 1), when chon
  bool chon;
  int ns;                // records staged in gs->stage: (wait, ready, done, id0, id1, seq)
  int ch_peer, ch_flags;
  u64 pt, pc;            // last (%globaltimer, clock64) pair: the SM clock's rate over the current slice

  __device__ bool post() const { return g.tid == g.post; }
  __device__ bool last_warp() const { return g.tid >= g.nthr - 32; }

  // Write the staged records into the rings: 16-byte stores, consecutive lanes on consecutive addresses,
  // seq words provisional (layout.SEQ_PROVISIONAL). Whole last warp.
  __device__ void flush() {
    __syncwarp();
    const u64 tag = (1ull << 63) | ((u64)(a->op_tag & 0x7FFFFFFFu) << 32);
    for (int j = g.tid & 31; j < 6 * ns; j += 32) {
      const u64* r = gs->stage[j / 6];
      const int part = j % 6, ring = part / 3, cw = part % 3;
      const u64 q = r[5];
      u64 x, y;
      if (cw == 0) { x = tag | (q & 0xFFFFFFFFull); y = ring ? 0 : r[0]; }      // seq, wait
      else if (cw == 1) { x = ring ? 0 : r[1]; y = ring ? r[2] : 0; }           // ready, done
      else { x = r[3]; y = r[4]; }                                               // identity words
      if (ST_HOST_STORES) st_volatile_v2((ring ? co : st) + (q & mask) * 6 + 2 * cw, x, y);
    }
    __syncwarp();
    ns = 0;
  }
  // A KernelCh start or stop record at seq q: clock t at both ends, staged by lane 0.
  __device__ void stage_ch(u32 q, u64 t, int stop) {
    if (ns + 1 > ST_STAGE) flush();
    if ((g.tid & 31) == 0) {
      u64* r = gs->stage[ns];
      r[0] = t; r[1] = t; r[2] = t;
      r[3] = id0(a->op_tag, 0); r[4] = id1(0, ch_peer, 1, ch_flags | (stop ? 2 : 0)); r[5] = q;
    }
    ns += 1;
  }

  __device__ void init(const Args* a_, const Comm* cm_, GrpShared* gs_, Grp g_, int ch, int prog) {
    a = a_; cm = cm_; gs = gs_; g = g_;
    c.s_stepp = 0; c.r_stepp = 0; c.s_peer = c.r_peer = 0;
    st = (u64*)cm->started + (u64)ch * cm->slots * 6;
    co = (u64*)cm->completed + (u64)ch * cm->slots * 6;
    mask = cm->slots - 1;
    seq = a->seq_base[prog]; seq_end = seq + a->seq_n[prog];
    ns = 0; aborted = false; k = 0; kr = 0;
  }
  __device__ static u64 round_up(u64 s, int m) { return (s + m - 1) / m * m; }

  __device__ void begin(int peer, int flags) {
    sstep = c.s_stepp ? round_up(*c.s_stepp, a->chunk_steps) : 0;
    rstep = c.r_stepp ? round_up(*c.r_stepp, a->chunk_steps) : 0;
    // NCCL's PostRecv: return credit for the steps the rounding skipped at once. Without it, two connections
    // both left off a chunk boundary (broadcast then reduce, then all_reduce) wait on each other's credit.
    if (post() && c.r_stepp && rstep != *c.r_stepp) st_relaxed_sys(c.r_head, rstep);
    ch_peer = peer; ch_flags = flags;
    if (STEPS && ST_TIMER_MODE && post()) { pc = clock64(); pt = gtimer(); }
    chon = false;
    if (a->stamp_ch && last_warp() && seq + 2 <= seq_end) {
      // KernelCh start = seq_base, stop = seq_base + 1 (stamps.layout: reserved together before the slices)
      const u64 t = __shfl_sync(0xffffffffu, gtimer(), 31);
      chq = seq; chon = true;
      seq += 2;
      stage_ch(chq, t, 0);
    }
  }
  __device__ void end() {
    if (!last_warp()) return;
    if (chon) stage_ch(chq + 1, __shfl_sync(0xffffffffu, gtimer(), 31), 1);
    if (ns) flush();                     // no fence: the op's completion makes these stores visible
    if (!post()) return;
    if (!aborted) {
      if (c.s_stepp) *c.s_stepp = sstep;
      if (c.r_stepp) *c.r_stepp = rstep;
    } else {
      st_volatile_u32((u32*)cm->status_host, 1u);
    }
  }

  // A role clock taken before the post thread's (cd cycles, td ns) pair, as %globaltimer ns.
  __device__ u64 ns_at(u64 c, u64 cd, u64 td, u64 rq16) const {
    if (!ST_TIMER_MODE) return c;
    const u64 dc = cd > c ? cd - c : 0;
    const u64 dn = (dc * rq16) >> 16;
    return dn < td ? td - dn : 0;
  }

  // Called by the group's last warp after the barrier: lane 31 posts; with STEPS the lanes then stage the
  // slice's records in shared memory (written to the rings in bursts by flush(), so no stamp store to host
  // memory is pending when the next slice's fence runs).
  __device__ void post_real(bool rv, bool sd, i64 n, int ss, bool stamp, int par) {
    const int lane = g.tid & 31;
    u64 td = 0, cd = 0, rq = 0;
    const int nd = (int)rv + (int)sd;
    const bool rec = STEPS && stamp && seq + nd <= seq_end && !(ST_DIAG & 2);
    if (lane == 31) {
      if (STEPS && stamp) {                            // done is read before the tail store
        td = gtimer();
        if (ST_TIMER_MODE) {
          cd = clock64();
          rq = cd - pc > 2000 && td > pt ? ((td - pt) << 16) / (cd - pc) : (u64)a->cyc_q16;
          pt = td; pc = cd;
        }
      }
      fence_sys();                                     // slice data (all workers, via the barrier) first
      if (sd) st_relaxed_sys(c.s_tail, sstep + ss);
      if (rv) st_relaxed_sys(c.r_head, rstep + ss);
    }
    if (!rec) return;
    if (ns + nd > ST_STAGE) flush();
    td = __shfl_sync(0xffffffffu, td, 31);
    if (ST_TIMER_MODE) { cd = __shfl_sync(0xffffffffu, cd, 31); rq = __shfl_sync(0xffffffffu, rq, 31); }
    if (lane < 6 * nd) stage_word(lane, rv, n, par, td, cd, rq);
    ns += nd; seq += nd;
  }
  // Word lane % 6 of record lane / 6 of this slice (recv first): wait, ready, done, id0, id1, seq.
  __device__ void stage_word(int lane, bool rv, i64 n, int par, u64 td, u64 cd, u64 rq) {
    const int e = lane / 6, w = lane % 6;
    const bool recv = rv && e == 0;
    const int dir = recv ? 0 : 1;
    u64 v;
    if (w == 0) v = ns_at(gs->clk[par][dir][0], cd, td, rq);
    else if (w == 1) v = ns_at(gs->clk[par][dir][1], cd, td, rq);
    else if (w == 2) v = td;
    else if (w == 3) v = id0(a->op_tag, recv ? rstep : sstep);
    else if (w == 4) v = id1((u64)n * sizeof(T), recv ? c.r_peer : c.s_peer, 0, recv ? 0 : 1);
    else v = seq + e;
    gs->stage[ns + e][w] = v;
  }

  // One slice of n elements. src/dst are user pointers at the slice (0 = unused).
  __device__ __noinline__ void slice(bool rv, bool sd, const T* src, T* dst, bool red, bool fin, i64 n, int ss) {
    const int par = kr & 1;   // only real slices pass barriers, so only they may flip the slot
    const bool stamp = STEPS && (k % a->sample_rate) == 0;
    if (n > 0) {
      if (g.tid == 0) {
        int ab = 0;
        if (rv) {
          const u64 tw = STEPS && !(ST_DIAG & 1) ? role_clock() : 0;
          ab = spin_until(c.r_tail, 0, rstep + ss, cm);
          if (STEPS && !(ST_DIAG & 1)) { gs->clk[par][0][0] = tw; gs->clk[par][0][1] = role_clock(); }
        }
        gs->ab[par][0] = ab;
      }
      if (g.tid == 1) {
        int ab = 0;
        if (sd) {
          const u64 tw = STEPS && !(ST_DIAG & 1) ? role_clock() : 0;
          ab = spin_until(c.s_head, ST_NCCL_STEPS, sstep + ss, cm);
          if (STEPS && !(ST_DIAG & 1)) { gs->clk[par][1][0] = tw; gs->clk[par][1][1] = role_clock(); }
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
