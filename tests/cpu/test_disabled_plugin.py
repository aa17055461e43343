"""A plugin disabled after its failures, in a real 2-rank run: every event it would have got is counted (before,
its later ops went uncounted: a plugin that missed 36 of 40 ops showed plugin_disabled 0)."""
from __future__ import annotations

import uuid

import numpy as np

import slicetrace
from slicetrace.events.abi import EventType as T

REPORTED: dict[str, dict] = {}      # in each rank process: plugin name -> the counters it was handed at close
SPEC = "tests.cpu.test_disabled_plugin:Healthy,tests.cpu.test_disabled_plugin:Raises"
N_OPS = 40


class Healthy:
    version = 8
    name = "healthy"

    def init(self, comm, mask):
        mask.value = int(T.COLL | T.KERNEL_STEP)
        return None

    def start_event(self, ctx, descr):
        return object()

    def stop_event(self, handle, ts_ns):
        pass

    def record_event_state(self, handle, state, args):
        pass

    def kernel_step_batch(self, ctx, parent, recs):
        return len(recs)

    def report_counters(self, ctx, counters):
        REPORTED[self.name] = dict(counters)

    def finalize(self, ctx):
        pass


class Raises(Healthy):
    name = "raises"

    def start_event(self, ctx, descr):
        raise RuntimeError("boom")


def _both_plugins(comm, job: str) -> dict:
    comm.barrier()
    with slicetrace.init(rank=comm.rank, world_size=comm.world_size, job=job, profiler_plugin=SPEC) as sub:
        x = np.ones(1 << 18, np.float32)
        for _ in range(N_OPS):
            sub.all_reduce(x, x)
    return dict(REPORTED)


def test_a_disabled_plugin_counts_what_its_healthy_twin_got():
    for rank, got in enumerate(slicetrace.launch(_both_plugins, 2, uuid.uuid4().hex[:10], join_timeout_s=120)):
        good, bad = got["healthy"], got["raises"]
        delivered = sum(v for k, v in good.items() if k.startswith("delivered_"))
        assert good["delivered_coll"] == N_OPS and good["delivered_kernel_step"] > N_OPS, (rank, good)
        assert not any(v for k, v in bad.items() if k.startswith("delivered_")), (rank, bad)
        assert bad["plugin_error"] == 16 and bad["plugin_disabled"] > 0, (rank, bad)     # plugin_max_failures
        assert bad["plugin_error"] + bad["parent_dropped"] + bad["plugin_disabled"] == delivered, (rank, good, bad)
