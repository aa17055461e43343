"""KernelStep stamps of GPU runs: geometry equals plan.traffic.expected_slices, clocks nest inside their
KernelCh window, and a receive never becomes ready before the matching send was done (across GPUs)."""
from __future__ import annotations

import numpy as np
import pytest

from slicetrace.stamps.layout import FLAG_CH_STOP, FLAG_SEND, KIND_CHANNEL, KIND_STEP
from tests.cuda import ranks


def by_channel(res):
    return res["stamps"]


def written(res):
    return sum(len(s) for s, _ in res["stamps"].values())


def check_geometry(res, expected, what):
    got = []
    for ch, (st, co) in sorted(res["stamps"].items()):
        steps = st["kind"] == KIND_STEP
        for e in st[steps]:
            got.append((ch, bool(e["flags"] & FLAG_SEND), int(e["peer"]), int(e["size"])))
    want = [(c, s, p, b) for c, s, p, _, b in expected]
    assert len(got) == len(want), f"{what}: {len(got)} KernelSteps, expected {len(want)}"
    assert got == want, f"{what}: slice geometry differs from expected_slices"


def check_nesting(res, what):
    for ch, (st, co) in res["stamps"].items():
        chan = st["kind"] == KIND_CHANNEL
        start, stop = chan & (st["flags"] & FLAG_CH_STOP == 0), chan & (st["flags"] & FLAG_CH_STOP != 0)
        assert start.sum() == 1 and stop.sum() == 1, f"{what}: channel {ch} KernelCh records {chan.sum()}"
        t0, t1 = int(st["ready"][start][0]), int(co["done"][stop][0])
        steps = st["kind"] == KIND_STEP
        w, r, d = st["wait"][steps].astype(np.int64), st["ready"][steps].astype(np.int64), co["done"][steps].astype(np.int64)
        assert (w <= r).all() and (r <= d).all(), f"{what}: wait <= ready <= done broken on channel {ch}"
        assert (w >= t0).all() and (d <= t1).all(), f"{what}: a KernelStep leaves its KernelCh window on {ch}"
        # start and stop are reserved together before the first slice (stamps.layout, GPU writer)
        q0 = int(st["seq"][start][0]) & 0xFFFFFFFF
        assert int(st["seq"][stop][0]) & 0xFFFFFFFF == q0 + 1 and ((st["seq"][steps] & 0xFFFFFFFF) > q0 + 1).all()


def steps_between(res, peer, is_send):
    """A rank's KernelSteps (res: its stamps) that send to or receive from `peer`, every record counted
    (causality's dicts would merge two records of one (channel, step))."""
    n = 0
    for st, _ in res["stamps"].values():
        m = (st["kind"] == KIND_STEP) & (((st["flags"] & FLAG_SEND) > 0) == is_send) & (st["peer"] == peer)
        n += int(m.sum())
    return n


def causality(res0, res1, src, dst):
    """Sends of rank src to dst vs receives at dst from src, matched by (channel, step)."""
    sends, recvs = {}, {}
    for ch, (st, co) in res0["stamps"].items():
        m = (st["kind"] == KIND_STEP) & ((st["flags"] & FLAG_SEND) > 0) & (st["peer"] == dst)
        for e, c in zip(st[m], co[m]):
            sends[(ch, int(e["step"]))] = int(c["done"]) + res0["offset"]
    for ch, (st, co) in res1["stamps"].items():
        m = (st["kind"] == KIND_STEP) & ((st["flags"] & FLAG_SEND) == 0) & (st["peer"] == src)
        for e in st[m]:
            recvs[(ch, int(e["step"]))] = int(e["ready"]) + res1["offset"]
    common = sends.keys() & recvs.keys()
    slack = res0["unc"] + res1["unc"]
    bad = [k for k in common if recvs[k] + slack < sends[k]]
    return len(common), len(bad), max((sends[k] - recvs[k] for k in common), default=0)


@pytest.mark.cuda
@pytest.mark.parametrize("func,count,nch", [("all_reduce", 3_000_017, 4), ("all_reduce", 1021, 1),
                                            ("all_gather", 1_500_001, 3), ("reduce_scatter", 700_001, 2),
                                            ("broadcast", 2_000_003, 2), ("reduce", 900_001, 5)])
def test_stamps_match_plan(pool2, func, count, nch):
    res = pool2.run(ranks.run_coll, func, "float32", "sum", count, 0, 11, nch, True)
    st = pool2.run(ranks.stamps, res[0]["tag"])
    for r in range(pool2.world):
        assert written(st[r]) == res[r]["reserved"], f"{func} rank {r}: every reserved stamp seq written once"
        exp = pool2.run(ranks.plan_expected, func, 4, count, nch, ranks=[r])[0]
        check_geometry(st[r], exp, f"{func} rank {r}")
        check_nesting(st[r], f"{func} rank {r}")
    n, bad, worst = causality(st[0], st[1], 0, 1)
    n2, bad2, worst2 = causality(st[1], st[0], 1, 0)
    print(f"\n{func}: causality pairs {n + n2}, violations {bad + bad2}, worst send.done-recv.ready "
          f"{max(worst, worst2)} ns, clock uncertainty {st[0]['unc']}+{st[1]['unc']} ns")
    # every send pairs with exactly one receive at its peer and back (broadcast/reduce: one direction is empty)
    for (src, dst), pairs in (((0, 1), n), ((1, 0), n2)):
        sends, recvs = steps_between(st[src], dst, True), steps_between(st[dst], src, False)
        assert pairs == sends == recvs, (func, src, dst, pairs, sends, recvs)
    assert n + n2 > 0 and bad + bad2 == 0


@pytest.mark.cuda
@pytest.mark.parametrize("pattern, nprog, nch", [("a2a", 2, 2), ("multi", 6, 8)])
def test_p2p_stamps(pool2, pattern, nprog, nch):
    res = pool2.run(ranks.run_p2p, "float32", 1_000_003, 2, pattern, nch, True)
    st = pool2.run(ranks.stamps, res[0]["tag"])
    for r in range(2):
        assert written(st[r]) == res[r]["reserved"]
        nsteps = sum(int((s["kind"] == KIND_STEP).sum()) for s, _ in st[r]["stamps"].values())
        nkch = sum(int((s["kind"] == KIND_CHANNEL).sum()) for s, _ in st[r]["stamps"].values())
        assert nkch == 2 * nprog and nsteps == nprog * -(-1_000_003 * 4 // (1 << 19)), (nkch, nsteps)
        check_nesting(st[r], f"p2p {pattern} rank {r}")       # one program per channel here, as a collective's
    # a connection runs on one channel at both ends: every send pairs with its receive by (channel, step)
    for src, dst in ((0, 1), (1, 0)):
        n, bad, _ = causality(st[src], st[dst], src, dst)
        sends, recvs = steps_between(st[src], dst, True), steps_between(st[dst], src, False)
        assert n == sends == recvs > 0 and bad == 0, (src, dst, n, sends, recvs, bad)


@pytest.mark.cuda
def test_sampling_counts_skipped(gpu, kcache):
    from tests.helpers.procs import RankPool
    pool = RankPool(2, timeout=300)
    try:
        pool.run(ranks.setup, {"cache_dir": kcache, "sample_rate": 3})
        res = pool.run(ranks.run_coll, "all_reduce", "float32", "sum", 2_000_000, 0, 4, 2, True)
        st = pool.run(ranks.stamps, res[0]["tag"])
        exp = pool.run(ranks.plan_expected, "all_reduce", 4, 2_000_000, 2, ranks=[0])[0]
        seen: dict = {}                  # every third slice per channel and direction (no empty slice at this size)
        kept = 0
        for ch, is_send, _, _, _ in exp:
            kept += seen.get((ch, is_send), 0) % 3 == 0
            seen[(ch, is_send)] = seen.get((ch, is_send), 0) + 1
        got = sum(int((s["kind"] == KIND_STEP).sum()) for s, _ in st[0]["stamps"].values())
        assert got == kept and st[0]["sampled"] == len(exp) - kept
        assert written(st[0]) == res[0]["reserved"]
        for src, dst in ((0, 1), (1, 0)):        # both ends keep the same steps: each kept send meets its receive
            n, bad, _ = causality(st[src], st[dst], src, dst)
            assert n == steps_between(st[src], dst, True) == steps_between(st[dst], src, False) > 0 and bad == 0
    finally:
        pool.close()


def _overflow(comm):
    import cupy
    with cupy.cuda.Device(comm._session.backend.device):
        x = cupy.ones(16 << 20, dtype=cupy.float32)          # 64 MiB on one channel: far more records than 64
        comm.all_reduce(x, x)
        comm.flush_profiler()
        return dict(comm.drop_counters())


@pytest.mark.cuda
def test_a_program_longer_than_the_ring_is_counted_overrun_whole(gpu, kcache):
    """With a program's range longer than the ring, its KernelCh stop (written last, at the range's second seq)
    used to overwrite one of the newest KernelSteps, which then read as unpaired. The stop is not written then:
    the ring's 64 slots hold the newest 64 steps, but their KernelCh start was lapped, so the drain counts them
    overrun too (stamps.pairing.after_lap: no KernelStep outside its KernelCh); each record once, none unpaired."""
    import slicetrace
    for c in slicetrace.launch(_overflow, 2, backend="cuda", cache_dir=kcache, nchannels=1, ring_slots=64,
                               profiler_plugin="example", timeout_s=30.0, join_timeout_s=240):
        assert not c.get("delivered_kernel_step") and c.get("overrun", 0) > 64, c
        assert not c.get("unpaired") and not c.get("unwritten"), c


def _one_past_the_ring(comm):
    import cupy
    with cupy.cuda.Device(comm._session.backend.device):
        x = cupy.ones(63 * 2048, dtype=cupy.float32)     # 63 one-step slices (8 KiB steps): 65 records, 64 slots
        comm.broadcast(x, x, root=0)
        comm.flush_profiler()
        return dict(comm.drop_counters())


@pytest.mark.cuda
def test_a_program_one_record_longer_than_the_ring_writes_its_stop(gpu, kcache):
    """A range of slots + 1 records laps the KernelCh start only (with the last step): the stop's slot holds no
    newer record, so the stop is written and counted overrun with the rest. The kernel took any range past the
    ring for one that laps its stop and left it out: 64 overrun and 1 unpaired on each rank."""
    import slicetrace
    for c in slicetrace.launch(_one_past_the_ring, 2, backend="cuda", cache_dir=kcache, nchannels=1, ring_slots=64,
                               buffsize=65536, profiler_plugin="example", timeout_s=30.0, join_timeout_s=240):
        assert c.get("overrun") == 65 and not c.get("unpaired") and not c.get("unwritten") \
            and not c.get("delivered_kernel_step"), c


def _f16_avg(comm):
    import cupy
    with cupy.cuda.Device(comm._session.backend.device):
        x = cupy.array([60000.0, 65504.0, 40000.0, -65504.0] * 1000, dtype=cupy.float16)   # vector and scalar paths
        comm.all_reduce(x, x, op="avg")
        y = cupy.empty(2000, cupy.float16)
        comm.reduce_scatter(cupy.array([60000.0, 65504.0] * 2000, dtype=cupy.float16), y, op="avg")
        return cupy.asnumpy(x).tolist()[:8], cupy.asnumpy(y).tolist()[:4]


@pytest.mark.cuda
def test_float_avg_multiplies_each_input_before_the_sum_as_nccl(gpu, kcache):
    """NCCL's PreMulSum for floating avg: each input times float(1.0/n) as it enters the sum. Summing first and
    dividing at the end overflowed float16 to inf where the mean (and NCCL's answer) is finite."""
    import slicetrace
    for x, y in slicetrace.launch(_f16_avg, 2, backend="cuda", cache_dir=kcache, timeout_s=30.0, join_timeout_s=240):
        assert x == [60000.0, 65504.0, 40000.0, -65504.0] * 2 and y == [60000.0, 65504.0] * 2
