"""Host mirrors of the kernel's Args and Comm structs (kernels/args.cuh) and the IPC memory layout.

The kernel static_asserts the same sizes; `tests/cuda/test_layout.py` checks offsets without a GPU.
"""
from __future__ import annotations

import numpy as np

MAXRANKS = 64
MAXP = 64            # p2p parts per launch
MAXB = 64            # blocks per launch
MAXG = 15            # p2p programs per block
MAX_THREADS = 512    # 480 workers + the post warp (kernels/common.cuh ST_MAX_THREADS: 128 registers)
CTRL = 128           # first tail slot; offset 0 holds the abort word peers may raise
FUNC_IDS = {"all_reduce": 0, "all_gather": 1, "reduce_scatter": 2, "broadcast": 3, "reduce": 4, "send_recv": 5}
REDOP_IDS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}
CTYPES = {"int8": "signed char", "uint8": "unsigned char", "int32": "int", "int64": "long long",
          "float16": "h16", "float32": "float", "float64": "double", "bfloat16": "b16"}
ITEMSIZE = {"int8": 1, "uint8": 1, "int32": 4, "int64": 8, "float16": 2, "float32": 4, "float64": 8, "bfloat16": 2}

PART_DTYPE = np.dtype([("ptr", "<u8"), ("count", "<i8"), ("peer", "<i4"), ("conn", "<i4"),
                       ("is_send", "<i4"), ("channel", "<i4")])
ARGS_DTYPE = np.dtype([
    ("comm", "<u8"), ("sendbuf", "<u8"), ("recvbuf", "<u8"),
    ("count", "<i8"), ("per_ch", "<i8"), ("chunk_elems", "<i8"),
    ("func", "<i4"), ("redop", "<i4"), ("nranks", "<i4"), ("rank", "<i4"), ("root", "<i4"), ("nblocks", "<i4"),
    ("step_bytes", "<i4"), ("slice_steps", "<i4"), ("chunk_steps", "<i4"), ("sample_rate", "<i4"),
    ("op_tag", "<u4"), ("stamp_ch", "<i4"), ("nparts", "<i4"), ("pad0", "<i4"),
    ("blk_first", "<u2", (MAXB,)), ("blk_n", "<u2", (MAXB,)),
    ("parts", PART_DTYPE, (MAXP,)),
    ("seq_base", "<u4", (MAXP,)), ("seq_n", "<u4", (MAXP,)),
])
COMM_DTYPE = np.dtype([
    ("peer_base", "<u8", (MAXRANKS,)), ("send_step", "<u8"), ("recv_step", "<u8"),
    ("ring", "<u8"), ("pad1", "<u8"),
    ("abort_host", "<u8"), ("status_host", "<u8"), ("fifo_off", "<u8"), ("buffsize", "<u8"),
    ("world", "<i4"), ("rank", "<i4"), ("nconn", "<i4"), ("slots", "<i4"),
])
assert PART_DTYPE.itemsize == 32
assert ARGS_DTYPE.fields["blk_first"][1] == 104 and ARGS_DTYPE.itemsize == 2920
assert COMM_DTYPE.itemsize == 8 * MAXRANKS + 8 * 8 + 16


def ipc_layout(world: int, nconn: int, buffsize: int) -> tuple[int, int]:
    """(fifo_off, total bytes) of one rank's IPC allocation: abort word, tails, heads, FIFOs."""
    nk = nconn * (world - 1)
    ctrl = CTRL + 2 * nk * 128
    fifo_off = -(-ctrl // 4096) * 4096
    return fifo_off, fifo_off + nk * buffsize


def peer_slot(rank: int, peer: int, world: int) -> int:
    return (peer - rank - 1 + world) % world
