"""A synthetic event source: realistic op / channel / slice streams for tests and benchmarks.

`SyntheticSource(nranks, rank, ...)` generates, per op, an `OpInfo` and the PAIRED_DTYPE records the drain
would hand to the event host: ring all-reduce (per channel and loop: send, (2k-3) x recv+send, recv; every
primitive moves `slices_per_chunk` slices, recv pair before send pair), or send/recv with the ring neighbours.
Clocks are plausible: per program the slices are sequential, wait <= ready <= done, KernelCh start before the
first wait and stop after the last done; steps grow by `slice_steps` per slice on each connection and persist
across ops. Device clocks = host ns - clock_offset_ns. Deterministic given `seed`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..errors import UsageError
from ..stamps.layout import FLAG_SEND, KIND_CHANNEL, KIND_STEP, PAIRED_DTYPE
from .host import EventHost, OpInfo, TaskInfo

FUNCS = ("all_reduce", "send_recv")


@dataclass
class SyntheticOp:
    info: OpInfo
    programs: list[tuple[int, np.ndarray, np.ndarray]]   # (channel, KernelStep records, KernelCh record) in ring order
    end_ns: int

    @property
    def steps(self) -> np.ndarray:
        return np.concatenate([p[1] for p in self.programs]) if self.programs else np.empty(0, PAIRED_DTYPE)

    @property
    def channels(self) -> np.ndarray:
        return np.concatenate([p[2] for p in self.programs]) if self.programs else np.empty(0, PAIRED_DTYPE)


class SyntheticSource:
    def __init__(self, nranks: int = 4, rank: int = 0, nchannels: int = 2, loops: int = 1,
                 slices_per_chunk: int = 2, slice_bytes: int = 256 << 10, slice_steps: int = 2,
                 funcs: tuple[str, ...] = ("all_reduce",), seed: int = 0, t0_ns: int = 1_000_000_000,
                 clock_offset_ns: int = 0, gbps: float = 100.0, mean_wait_ns: float = 2000.0):
        if nranks < 2 or not 0 <= rank < nranks:
            raise UsageError(f"nranks={nranks}, rank={rank}: need nranks >= 2 and 0 <= rank < nranks")
        bad = [f for f in funcs if f not in FUNCS]
        if bad or not funcs:
            raise UsageError(f"funcs={funcs!r}: each must be one of {FUNCS}")
        self.nranks, self.rank, self.nchannels, self.loops = nranks, rank, nchannels, loops
        self.slices_per_chunk, self.slice_bytes, self.slice_steps = slices_per_chunk, slice_bytes, slice_steps
        self.funcs, self.offset, self.gbps, self.mean_wait = funcs, clock_offset_ns, gbps, mean_wait_ns
        self.rng = np.random.default_rng(seed)
        self.now = t0_ns
        self.tag = 0
        self.seq: dict[str, int] = {}
        self.conn_step: dict[tuple[int, int, int], int] = {}      # (channel, is_send, peer) -> FIFO step
        self.send_peer = (rank + 1) % nranks
        self.recv_peer = (rank - 1) % nranks
        k = nranks
        prims = ["S"] + ["RS"] * (2 * k - 3) + ["R"]
        per_loop: list[int] = []                                      # 0 = recv, 1 = send; recv first
        for p in prims:
            for _ in range(slices_per_chunk):
                per_loop += ([0] if "R" in p else []) + ([1] if "S" in p else [])
        self._ring_dirs = np.array(per_loop * loops, np.uint8)

    def _program(self, op32: int, ch: int, dirs: np.ndarray, start: int, p2p_peer: int = -1,
                 p2p_send: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
        n, rng = len(dirs), self.rng
        recs = np.zeros(n, PAIRED_DTYPE)
        peer = np.where(dirs == 1, self.send_peer, self.recv_peer) if p2p_peer < 0 else np.full(n, p2p_peer)
        wait_d = rng.exponential(self.mean_wait, n).astype(np.int64) + 50
        xfer = int(self.slice_bytes / self.gbps) + 1                  # bytes / (GB/s) = ns
        xfer_d = (xfer * rng.uniform(0.9, 1.1, n)).astype(np.int64) + 1
        total = wait_d + xfer_d + 40                                 # 40 ns between post and next wait
        wait = start + 200 + np.cumsum(total) - total
        ready, done = wait + wait_d, wait + wait_d + xfer_d
        steps = np.empty(n, np.int64)
        for is_send in (0, 1):                                        # per-connection FIFO step numbers
            idx = np.flatnonzero(dirs == is_send)
            if len(idx):
                key = (ch, is_send, int(peer[idx[0]]))
                base = self.conn_step.get(key, 0)
                steps[idx] = base + self.slice_steps * np.arange(len(idx))
                self.conn_step[key] = base + self.slice_steps * len(idx)
        recs["op"], recs["channel"], recs["kind"], recs["flags"] = op32, ch, KIND_STEP, dirs * FLAG_SEND
        recs["peer"], recs["step"], recs["size"] = peer, steps & 0xFFFFFFFF, self.slice_bytes
        recs["wait_ns"], recs["ready_ns"], recs["done_ns"] = wait, ready, done
        recs["wait"], recs["ready"], recs["done"] = wait - self.offset, ready - self.offset, done - self.offset
        stop = int(done[-1]) + 100 if n else start + 300
        chrec = np.zeros(1, PAIRED_DTYPE)
        chrec["op"], chrec["channel"], chrec["kind"] = op32, ch, KIND_CHANNEL
        if p2p_peer >= 0:
            chrec["peer"], chrec["flags"] = p2p_peer, FLAG_SEND if p2p_send else 0
        chrec["ready_ns"], chrec["done_ns"] = start, stop
        chrec["ready"], chrec["done"] = start - self.offset, stop - self.offset
        return recs, chrec, stop

    def next_op(self, mask: int | None = None) -> SyntheticOp:
        func = self.funcs[self.tag % len(self.funcs)]
        self.tag += 1
        tag, op32 = self.tag, self.tag & 0xFFFFFFFF
        self.seq[func] = seq = self.seq.get(func, -1) + 1
        ts = self.now
        programs, end = [], ts
        count = self.slice_bytes // 4 * self.slices_per_chunk * self.nranks * self.nchannels * self.loops
        if func == "all_reduce":
            tasks = [TaskInfo("AllReduce", -1, False, count, "ncclFloat32", 0, 0x1000, 0x2000, self.nchannels)]
            for ch in range(self.nchannels):
                start = ts + 5000 + int(self.rng.integers(0, 500))
                recs, chrec, stop = self._program(op32, ch, self._ring_dirs, start)
                programs.append((ch, recs, chrec))
                end = max(end, stop)
        else:
            n = self.slices_per_chunk * self.loops
            tasks = [TaskInfo("Send", self.send_peer, True, count, "ncclFloat32", 0, 0x1000, 0, self.nchannels),
                     TaskInfo("Recv", self.recv_peer, False, count, "ncclFloat32", 0, 0, 0x2000, self.nchannels)]
            for ch in range(self.nchannels):
                start = ts + 5000 + int(self.rng.integers(0, 500))
                for t in tasks:
                    dirs = np.full(n, 1 if t.is_send else 0, np.uint8)
                    recs, chrec, stop = self._program(op32, ch, dirs, start, t.peer, t.is_send)
                    programs.append((ch, recs, chrec))
                    end = max(end, stop)
        self.now = end + 20_000
        info = OpInfo(tag=tag, func=func, tasks=tasks, seq_number=seq, mask=mask, ts_ns=ts, n_warps=16)
        return SyntheticOp(info, programs, end + 1000)

    def ops(self, n: int, mask: int | None = None) -> Iterator[SyntheticOp]:
        for _ in range(n):
            yield self.next_op(mask)


def deliver(host: EventHost, op: SyntheticOp, batch: int = 0) -> None:
    """Feed one op to a host as the drain would: per program its KernelSteps (in batches), then its KernelCh."""
    tag = op.info.tag
    for _, recs, chrec in op.programs:
        if batch <= 0 or len(recs) <= batch:
            host.steps(tag, recs)
        else:
            for a in range(0, len(recs), batch):
                host.steps(tag, recs[a:a + batch])
        host.channel(tag, chrec)
    host.end_op(tag, op.end_ns)


def drive(host: EventHost, source: SyntheticSource, n_ops: int, batch: int = 0) -> int:
    """Run n_ops synthetic ops through host (mask snapshot, begin_op, records, end_op); returns KernelSteps fed."""
    fed = 0
    for _ in range(n_ops):
        op = source.next_op(host.op_mask())
        host.begin_op(op.info)
        deliver(host, op, batch)
        fed += sum(len(p[1]) for p in op.programs)
    return fed
