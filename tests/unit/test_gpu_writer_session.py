"""The cuda backend's host path end to end, without a GPU: a backend that reserves seq ranges with the real
SeqRanges and, when its op "completes" (asynchronously, seen by the drain thread), writes every record the way
the kernel does (KernelCh start and stop first, KernelSteps in slice order, provisional seq words). Through the
Session, the drain thread, the event host and the example plugin to a trace that must hold every invariant."""
from __future__ import annotations

import glob
import time

import numpy as np
import pytest

import slicetrace.session as session_mod
from slicetrace.analyze import check_trace
from slicetrace.analyze.trace import kernel_steps, load_traces
from slicetrace.backend.base import Work
from slicetrace.backend.cuda.layout import ARGS_DTYPE
from slicetrace.backend.cuda.seqs import SeqRanges, copy_regions, copy_windows
from slicetrace.backend.null import NullBackend
from slicetrace.config import Settings
from slicetrace.events.ops import OpInfo, TaskInfo
from slicetrace.plan.schedule import P2pPart, plan_collective, plan_p2p
from slicetrace.rendezvous import DictStore
from slicetrace.stamps.layout import (FLAG_CH_STOP, FLAG_SEND, HEADER_DTYPE, KIND_CHANNEL, KIND_STEP,
                                     RingViews, provisional_word)


class _Token:
    def __init__(self, polls: int, write):
        self.polls, self.write = polls, write


class GpuLike(NullBackend):
    """Asynchronous; its records appear only when the op completes, as a kernel's do."""
    synchronous = False
    reserves_stamps = True

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.seqs = SeqRanges(self.rings)
        self.st = self.rings.started.view(np.uint64).reshape(self.nch, -1, 6)
        self.co = self.rings.completed.view(np.uint64).reshape(self.nch, -1, 6)
        self.written = 0
        self.fetch_calls = 0

    def fetch_stamps(self, lo, hi):
        self.fetch_calls += 1               # mapped rings (stamps_fetched False): the drain must never ask

    def submit(self, work: Work) -> _Token:
        rec = np.zeros(1, ARGS_DTYPE)
        if work.stamp_steps or work.stamp_channels:
            self.seqs.reserve(work, rec)
        progs = work.plan.programs if work.plan.func != "send_recv" else \
            sorted(work.plan.programs, key=lambda q: (q.channel, q.params["part"]))
        ranges = [(p, int(b), int(n)) for p, b, n in zip(progs, rec["seq_base"][0], rec["seq_n"][0])]
        return _Token(3, lambda: [self._program(work, *r) for r in ranges])

    def done(self, token: _Token) -> bool:
        token.polls -= 1
        if token.polls > 0:
            return False
        if token.write is not None:                    # the kernel's stores land before completion is seen
            token.write()
            token.write = None
        return True

    def wait(self, token, timeout_s):
        while not self.done(token):
            pass

    def _program(self, work: Work, prog, base: int, n: int) -> None:
        op, rate, t = work.tag & 0xFFFFFFFF, max(1, work.sample_rate), time.monotonic_ns()
        peer, fl = (prog.params["peer"], FLAG_SEND if prog.params["is_send"] else 0) if prog.kind == "p2p" else (0, 0)
        recs = []
        if work.stamp_channels:
            recs += [(KIND_CHANNEL, fl, 0, 0, peer, t, t, t), (KIND_CHANNEL, fl | FLAG_CH_STOP, 0, 0, peer, 0, 0, 0)]
        k, clock = [0, 0], t          # per direction (recv, send): the kernel's sampling counters
        for prim in prog.prims:
            for _, cnt in prim.slices:
                for d, (p, f) in enumerate(((prim.recv_from, 0), (prim.send_to, FLAG_SEND))):
                    if p is None:
                        continue
                    if cnt and work.stamp_steps and k[d] % rate == 0:
                        recs.append((KIND_STEP, f, k[d] * 2, cnt * work.plan.itemsize, p, clock + 1, clock + 2,
                                     clock + 3))
                        clock += 4
                    k[d] += 1
        if work.stamp_channels:
            recs[1] = recs[1][:5] + (clock + 1,) * 3
        assert len(recs) == n, "SeqRanges and the writer disagree on the record count"
        for q, (kind, f, step, size, p, w, r, d) in enumerate(recs, start=base):
            i0 = op | step << 32
            i1 = size | (p & 0xFFFF) << 32 | kind << 48 | f << 56
            word, i = provisional_word(q, op), q & (self.rings.slots - 1)
            if self.st is self.co:                     # one ring (the cuda kernel's): the whole entry at once
                self.co[prog.channel, i] = (word, w, r, d, i0, i1)
            else:
                self.st[prog.channel, i] = (word, w, r, 0, i0, i1)
                self.co[prog.channel, i] = (word, 0, 0, d, i0, i1)
        self.written += n


class DeviceRings(GpuLike):
    """One ring in "device memory" (a separate buffer, the kernel's layout: whole entries) and a merged host
    mirror, as the cuda backend has: the drain sees a record only after fetch_stamps copied the windows the
    cuda backend would copy (seqs.copy_windows/copy_regions)."""
    stamps_fetched = True

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        slots = self.rings.slots
        self._rings = RingViews(self._mem, self.nch, slots, merged=True)     # NullBackend's memory, one ring
        self.seqs = SeqRanges(self._rings)
        self.dev = np.zeros(self.nch * slots * 6, np.uint64)
        self.st = self.co = self.dev.reshape(self.nch, slots, 6)
        self.mirror = np.frombuffer(self._mem, np.uint8)[self.nch * HEADER_DTYPE.itemsize:]
        self.fetched = 0

    def fetch_stamps(self, lo, hi):
        src = self.dev.view(np.uint8)
        for off, pitch, width, height in copy_regions(copy_windows(lo, hi, self.rings.slots), self.rings.slots):
            for r in range(height):
                a = off + r * pitch
                self.mirror[a:a + width] = src[a:a + width]
        self.fetched += int((hi - lo).clip(0).sum())


def _session(tmp_path, monkeypatch, cls=None, **kw):
    monkeypatch.setattr(session_mod, "create", lambda s, r, w, st, j: (cls or GpuLike)(s, r, w, st, j))
    return session_mod.Session(Settings(backend="null", nchannels=4, buffsize=64 * 1024, p2p_chunksize=4096,
                                        profiler_plugin="example", profile_dump_file=str(tmp_path / "t"),
                                        drain_interval_us=50, **kw), 0, 2, DictStore({}), "gpulike")


@pytest.fixture(params=[GpuLike, DeviceRings], ids=["mapped", "device"])
def session(tmp_path, monkeypatch, request):
    s = _session(tmp_path, monkeypatch, request.param)
    yield s, tmp_path
    s.close()


def _op(s, tag, func, tasks):
    return OpInfo(tag=tag, func=func, tasks=tasks, seq_number=tag, mask=s.op_mask_for(0), ts_ns=time.monotonic_ns())


@pytest.mark.parametrize("p2p_channels", [2, 4])
def test_records_written_at_completion_reach_the_trace_whole(session, p2p_channels):
    """Two sends to one peer in each group: on 2 channels they share one (their records cannot be told apart),
    on 4 each has its own; either way every record arrives once, inside its parent."""
    s, tmp = session
    x, y = np.ones(40_000, np.float32), np.ones(80_000, np.float32)
    tag = 0
    for rep in range(6):
        for func, count in (("all_reduce", 40_000), ("all_gather", 40_000), ("broadcast", 12_345)):
            tag += 1
            plan = plan_collective(func, 2, 0, count, 4, 0, 4, s.settings.step_bytes)
            task = TaskInfo(func={"all_reduce": "AllReduce", "all_gather": "AllGather", "broadcast": "Broadcast"}[func],
                            count=count, n_programs=len(plan.programs))
            s.run(Work(tag, plan, "float32", "sum", sendbuf=x, recvbuf=y), _op(s, tag, func, [task]))
        tag += 1
        parts = [P2pPart(1, True, 30_000, 0), P2pPart(1, False, 30_000, 1), P2pPart(1, True, 7_000, 2)]
        plan = plan_p2p(parts, 2, 0, 4, 4096, s.settings.step_bytes, p2p_channels)
        chans = [tuple(sorted({q.channel for q in plan.programs if q.params["part"] == p.index})) for p in parts]
        tasks = [TaskInfo(func="Send" if p.is_send else "Recv", peer=1, is_send=p.is_send, count=p.count,
                          n_programs=sum(1 for q in plan.programs if q.params["part"] == p.index), channels=ch)
                 for p, ch in zip(parts, chans)]
        s.run(Work(tag, plan, "float32", "sum", parts=[(p, x[:p.count]) for p in parts]), _op(s, tag, "send", tasks))
    assert s.drain.flush(10.0)
    counters = s.host.counters()
    written = s.backend.written
    s.close()
    path = glob.glob(str(tmp / "t_*_0.json"))[0]
    assert check_trace(path) == []
    recs = load_traces([path])
    n_steps = len(kernel_steps(recs))
    n_ch = sum(1 for r in recs if r.get("name") == "KernelCh" and r.get("ph") == "b")
    assert n_steps + 2 * n_ch == written > 0
    if isinstance(s.backend, DeviceRings):
        assert s.backend.fetched == written                       # device rings: each record copied once
    else:
        assert s.backend.fetch_calls == 0                         # mapped rings are read where they are
    lost = {k: v for k, v in counters.items() if v and k in ("overrun", "unpaired", "unwritten", "no_parent",
                                                              "parent_dropped", "missing_kernel_ch", "pool_full",
                                                              "declined")}
    assert not lost, lost


@pytest.mark.parametrize("cls", [GpuLike, DeviceRings], ids=["mapped", "device"])
def test_sampling_unprofiled_and_empty_ops_between_keep_the_counts_exact(tmp_path, monkeypatch, cls):
    s = _session(tmp_path, monkeypatch, cls, sample_rate=3)
    x = np.ones(60_000, np.float32)
    kept = skipped = 0
    for tag in range(1, 25):
        count = 0 if tag % 7 == 0 else 60_000 - tag
        plan = plan_collective("all_reduce", 2, 0, count, 4, 0, 4, s.settings.step_bytes)
        work = Work(tag, plan, "float32", "sum", sendbuf=x[:count], recvbuf=x[:count])
        if tag % 3 == 0:
            s.run(work, None)                                   # unprofiled: no seqs reserved, nothing written
            continue
        task = TaskInfo(func="AllReduce", count=count, n_programs=len(plan.programs))
        s.run(work, _op(s, tag, "all_reduce", [task]))
        for prog in plan.programs:
            k = {"recv": 0, "send": 0}          # slices counted per direction, empty ones included
            for prim in prog.prims:
                dirs = [d for d, p in (("recv", prim.recv_from), ("send", prim.send_to)) if p is not None]
                for _, n in prim.slices:
                    for d in dirs:
                        if n:
                            kept, skipped = (kept + 1, skipped) if k[d] % 3 == 0 else (kept, skipped + 1)
                        k[d] += 1
    assert s.drain.flush(10.0)
    c = s.host.counters()
    s.close()
    path = glob.glob(str(tmp_path / "t_*_0.json"))[0]
    assert check_trace(path) == []
    assert len(kernel_steps(load_traces([path]))) == kept == c["delivered_kernel_step"] > 0
    assert c["sampled_out"] == skipped > 0
    assert not {k: v for k, v in c.items() if v and k in ("overrun", "unpaired", "unwritten", "no_parent",
                                                                 "missing_kernel_ch")}


class Holey(DeviceRings):
    """A kernel that died before writing one record of some programs (seqs reserved, never written)."""
    holes = 0

    def _program(self, work, prog, base, n):
        super()._program(work, prog, base, n)
        if work.tag % 4 == 1 and n > 3:
            i = (base + 3) & (self.rings.slots - 1)
            self.st[prog.channel, i, 0] = self.co[prog.channel, i, 0] = 0
            self.holes += 1


def test_records_a_kernel_never_wrote_are_counted_once_and_nothing_waits_for_them(tmp_path, monkeypatch):
    s = _session(tmp_path, monkeypatch, Holey)
    x = np.ones(50_000, np.float32)
    for tag in range(1, 21):
        plan = plan_collective("all_reduce", 2, 0, 50_000, 4, 0, 4, s.settings.step_bytes)
        task = TaskInfo(func="AllReduce", count=50_000, n_programs=len(plan.programs))
        s.paused = 10 <= tag < 13                           # a pause while earlier ops are still in flight
        s.run(Work(tag, plan, "float32", "sum", sendbuf=x, recvbuf=x),
              None if s.paused else _op(s, tag, "all_reduce", [task]))
    assert s.drain.flush(5.0)
    c = s.host.counters()
    s.close()
    path = glob.glob(str(tmp_path / "t_*_0.json"))[0]
    assert check_trace(path) == []
    assert c["unwritten"] == s.backend.holes == 20 and not c["unpaired"]      # never written: neither half came
    assert len(kernel_steps(load_traces([path]))) + 2 * c["delivered_kernel_ch"] + c["unwritten"] == s.backend.written


def test_device_rings_whose_channels_drift_apart_are_fetched_channel_by_channel(tmp_path, monkeypatch):
    """p2p on one channel moves it more than a ring ahead of the others: the copy windows cannot share a span
    (seqs.copy_windows then copies channel by channel), and every record still arrives exactly once."""
    s = _session(tmp_path, monkeypatch, DeviceRings, ring_slots=128)
    x = np.ones(40_000, np.float32)
    tag = 0
    for rep in range(3):
        for _ in range(12):                               # channel 0 only: 12 x (2 KernelCh + 10 KernelSteps)
            tag += 1
            part = P2pPart(1, True, 20_000, 0)
            plan = plan_p2p([part], 2, 0, 4, 8192, s.settings.step_bytes, 1)
            task = TaskInfo(func="Send", peer=1, is_send=True, count=20_000, n_programs=len(plan.programs),
                            channels=(0,))
            s.run(Work(tag, plan, "float32", "sum", parts=[(part, x[:20_000])]), _op(s, tag, "send", [task]))
            assert s.drain.flush(5.0)                     # drained before the next: a small ring, no lapping
        tag += 1
        plan = plan_collective("all_reduce", 2, 0, 40_000, 4, 0, 4, s.settings.step_bytes)
        task = TaskInfo(func="AllReduce", count=40_000, n_programs=len(plan.programs))
        s.run(Work(tag, plan, "float32", "sum", sendbuf=x, recvbuf=x), _op(s, tag, "all_reduce", [task]))
    assert s.drain.flush(10.0)
    c = s.host.counters()
    hdr = s.backend.rings.header["reserved"].astype(np.int64)
    written, fetched = s.backend.written, s.backend.fetched
    s.close()
    assert hdr[0] - hdr[1:].max() > 128                   # channel 0 ran more than a ring ahead
    path = glob.glob(str(tmp_path / "t_*_0.json"))[0]
    assert check_trace(path) == []
    assert c["delivered_kernel_step"] + 2 * c["delivered_kernel_ch"] == written == fetched > 0
    assert not {k: v for k, v in c.items() if v and k in ("overrun", "unpaired", "unwritten", "no_parent",
                                                                 "missing_kernel_ch")}
