"""backend='null': moves no data between ranks, but writes the stamps a real run of each plan would write.

For tests of the drain and event host without processes, and for world == 1 (where a collective is a
local copy, which this backend does). Clocks are synthetic but ordered like a real run: per slice
wait <= ready <= done, slices of a program back to back, sizes and FIFO steps exactly as the cpu backend
writes them (persistent per connection, rounded up to the chunk steps when a program starts).
"""
from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from ..errors import BackendError, PeerError
from ..stamps.layout import FLAG_SEND, KIND_STEP, RingViews, RingWriter, ring_bytes
from .base import HostBackend, Work, part_views

log = logging.getLogger("slicetrace")
WAIT_NS = 200            # synthetic credit/data wait per slice
BYTES_PER_NS = 10.0      # synthetic copy speed (10 GB/s)


class NullBackend(HostBackend):
    name = "null"
    synchronous = True          # submit() returns when the work is done

    def __init__(self, settings, rank: int, world: int, store, job: str):
        super().__init__(settings, rank, world, store, job)
        if world > 1:        # the outputs of a run of several ranks are not computed: never let that pass unsaid
            log.warning("rank %d: backend='null' moves no data between its %d ranks: collectives and receives leave "
                        "their outputs as they were (it is for tests of the profiler path; use 'cpu' or 'cuda')",
                        rank, world)
        self.nch = settings.channels
        self._mem = bytearray(ring_bytes(self.nch, settings.ring_slots))
        self._rings = RingViews(self._mem, self.nch, settings.ring_slots)
        self._writers = [RingWriter(self._rings, c) for c in range(self.nch)]
        self._steps: dict[tuple, int] = {}
        self._ntok = 0
        self._aborted: str | None = None
        self._closed = False
        self._clock = 0

    @property
    def rings(self) -> RingViews:
        return self._rings

    def _now(self) -> int:
        self._clock = max(self._clock + 1, time.monotonic_ns())
        return self._clock

    def submit(self, work: Work) -> Any:
        if self._closed:
            raise BackendError(f"rank {self.rank}: the null backend is closed")
        if self._aborted is not None:
            raise PeerError(self._aborted)
        plan = work.plan
        if plan.func == "send_recv":
            parts = part_views(work.parts)
            sends = [b for p, b in parts if p.peer == self.rank and p.is_send]
            recvs = [b for p, b in parts if p.peer == self.rank and not p.is_send]
            for s, r in zip(sends, recvs):
                np.copyto(r[:s.size], s[:r.size])
        elif plan.nranks == 1 and plan.count and work.sendbuf is not work.recvbuf:
            np.copyto(work.recvbuf, work.sendbuf[:work.recvbuf.size])
        if work.stamp_steps or work.stamp_channels:
            for prog in plan.programs:
                self._stamp_program(work, prog)
        self._ntok += 1
        return self._ntok

    def _stamp_program(self, work: Work, prog) -> None:
        plan, w = work.plan, self._writers[prog.channel]
        op, ss, rate = work.tag & 0xFFFFFFFF, plan.proto.slice_steps, max(1, work.sample_rate)
        if prog.kind == "p2p":
            peer, flags = prog.params["peer"], FLAG_SEND if prog.params["is_send"] else 0
        else:
            peer, flags = 0, 0
        if work.stamp_channels:
            w.channel(False, flags, op, peer, self._now())
        keys = set()
        kr = ks = 0
        for prim in prog.prims:
            dirs = []
            if prim.recv_from is not None:
                dirs.append((0, prim.recv_from, self._key(prog, prim.recv_from, False)))
            if prim.send_to is not None:
                dirs.append((FLAG_SEND, prim.send_to, self._key(prog, prim.send_to, True)))
            for key in (d[2] for d in dirs):
                if key not in keys:          # rounded once per program, as the cpu backend does
                    keys.add(key)
                    self._steps[key] = -(-self._steps.get(key, 0) // plan.proto.chunk_steps) * plan.proto.chunk_steps
            for _, n in prim.slices:
                nbytes = n * plan.itemsize
                for fl, p, key in dirs:
                    step = self._steps[key]
                    self._steps[key] = step + ss
                    if n == 0 or not work.stamp_steps:
                        continue
                    if (ks if fl else kr) % rate:     # per direction: plan.traffic.stamp_records
                        w.sampled_out(1)
                        continue
                    wait = self._now()
                    ready = wait + WAIT_NS
                    done = ready + int(nbytes / BYTES_PER_NS) + 1
                    self._clock = done
                    seq = w.start(KIND_STEP, fl, op, step, nbytes, p, wait, ready)
                    w.complete(seq, KIND_STEP, fl, op, step, nbytes, p, done)
                kr += prim.recv_from is not None
                ks += prim.send_to is not None
        if work.stamp_channels:
            w.channel(True, flags, op, peer, self._now())

    @staticmethod
    def _key(prog, peer: int, is_send: bool) -> tuple:
        return ("p2p", peer, is_send) if prog.kind == "p2p" else ("ring", prog.channel, peer, is_send)

    def done(self, token: Any) -> bool:
        return True

    def wait(self, token: Any, timeout_s: float) -> None:
        if self._aborted is not None:
            raise PeerError(self._aborted)

    def abort(self, reason: str) -> None:
        self._aborted = reason

    def close(self) -> None:
        self._closed = True
