// Launch arguments and the communicator's device state. The host mirrors both layouts as numpy dtypes
// (backend/cuda/layout.py); the static_asserts below pin the sizes both sides agree on.
#pragma once
#include "common.cuh"

struct P2pDesc {        // one send or recv of a group (32 bytes)
  u64 ptr;              // user buffer
  i64 count;            // elements
  int peer;             // communicator rank
  int conn;             // connection channel: ordinal among this group's parts with the same peer and direction
  int is_send;
  int channel;          // stamp ring (the plan's ChannelProgram.channel)
};

struct Args {
  u64 comm;             // const Comm* (device memory)
  u64 sendbuf, recvbuf;
  i64 count;            // plan count (NCCL semantics)
  i64 per_ch;           // elements of every channel but the last
  i64 chunk_elems;
  int func, redop, nranks, rank, root, nblocks;
  int step_bytes, slice_steps, chunk_steps, sample_rate;
  u32 op_tag;
  int stamp_ch;         // KernelCh boundaries on
  int nparts;
  int pad0;
  u16 blk_first[ST_MAXB];
  u16 blk_n[ST_MAXB];
  P2pDesc parts[ST_MAXP];
  u32 seq_base[ST_MAXP];  // stamp seqs reserved by the host per program (ring: block; p2p: part), low 32 bits
  u32 seq_n[ST_MAXP];     // and how many: the kernel never writes past them
};
static_assert(sizeof(P2pDesc) == 32, "P2pDesc layout");
static_assert(sizeof(Args) == 2920, "Args layout");

struct Comm {
  u64 peer_base[ST_MAXRANKS];   // each rank's IPC allocation as mapped here (own = local)
  u64 send_step, recv_step;     // u64[nconn * (world-1)] device memory, persistent across launches
  u64 ring, pad1;              // stamp ring in device memory, whole entries (stamps/layout.py GPU rules)
  u64 abort_host, status_host;  // u32* mapped host memory
  u64 fifo_off, buffsize;
  int world, rank, nconn, slots;
};
static_assert(sizeof(Comm) == 8 * ST_MAXRANKS + 8 * 8 + 16, "Comm layout");

// IPC allocation: [0] abort word | tails (128 B apart) | heads | FIFOs (buffsize each), slot k = c*(W-1)+peer slot
#define ST_CTRL 128
__device__ __forceinline__ u64 tail_off(int k) { return ST_CTRL + (u64)k * 128; }
__device__ __forceinline__ u64 head_off(const Comm* cm, int k) {
  return ST_CTRL + ((u64)cm->nconn * (cm->world - 1) + k) * 128;
}
// Slot of peer p in rank r's tables.
__device__ __forceinline__ int peer_slot(int r, int p, int w) { return (p - r - 1 + w) % w; }
