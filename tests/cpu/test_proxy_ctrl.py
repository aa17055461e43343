"""ProxyCtrl on real cpu runs: the drain's state spans in the example plugin's trace, only when asked for."""
from __future__ import annotations

import json

import numpy as np
import pytest

from slicetrace.analyze import check_trace
from slicetrace.events.abi import EventType as T
from slicetrace.sinks.chrome import DEFAULT_MASK
from tests.helpers.procs import RankPool

KW = dict(buffsize=1 << 16, nchannels=2, timeout_s=30.0, profiler_plugin="example")
N_AR, N_AG = 40, 3          # collectives per run, and one send/recv group: N_AR + N_AG + 1 ops


@pytest.fixture(scope="module")
def pool2():
    p = RankPool(2, timeout=240)
    yield p
    p.close()


def _run(ctx, prefix, mask):
    """Profiled ops on a communicator of their own, closed: returns this rank's trace file."""
    import slicetrace
    r, n = ctx["rank"], ctx["world"]
    c = slicetrace.init(rank=r, world_size=n, store=ctx["store"], job=f"{ctx['job']}m{mask}",
                        profile_dump_file=prefix, profile_event_mask=mask, **KW)
    try:
        x = np.full(5000, r + 1, np.float32)
        for _ in range(N_AR):
            c.all_reduce(x)
        c.flush_profiler()              # a poll of its own: its Append takes the ops since the last
        for _ in range(N_AG):
            c.all_gather(x)
        with c.group():
            c.send(x, (r + 1) % n)
            c.recv(np.empty_like(x), (r - 1) % n)
    finally:
        c.close()
    return f"{prefix}_{c.comm_hash}_{r}.json"


def _load(path):
    with open(path) as f:
        return json.load(f)


def test_the_drain_s_states_are_in_the_trace_in_a_valid_order(pool2, tmp_path):
    files = pool2.run(_run, str(tmp_path / "pc"), DEFAULT_MASK | int(T.PROXY_CTRL))
    for path in files:
        assert check_trace(path) == [], path
        recs = _load(path)
        spans = sorted(((r["ts"], r["dur"], r["name"], r.get("args")) for r in recs
                        if r.get("cat") == "PROXY"), key=lambda s: s[0])
        assert spans and {r.get("ph") for r in recs if r.get("cat") == "PROXY"} == {"X"}
        states = [s for s in spans if s[2] in ("Idle", "Active")]
        appends = [s for s in spans if s[2] == "Append"]
        assert len(states) + len(appends) == len(spans)      # the cpu drain runs inline: no thread to sleep
        # one long-lived state, switched where it changed: the inline drain polls only after ops, so every poll
        # delivers (Active from the first) until close's final poll finds nothing (Idle, to close)
        assert [s[2] for s in states] == ["Active", "Idle"], states
        assert abs(states[0][0] + states[0][1] - states[1][0]) < 0.002, states
        # each poll that took new ops appended them: every op, once, inside the drain's time line
        assert sum(s[3]["appended"] for s in appends) == N_AR + N_AG + 1
        assert all(states[0][0] <= s[0] and s[0] + s[1] <= states[-1][0] + states[-1][1] for s in appends)
        ops = [r for r in recs if r.get("ph") == "b" and r.get("cat") in ("COLL", "P2P")]
        assert len([r for r in ops if r["cat"] == "COLL"]) == N_AR + N_AG
        counters = next(r["args"] for r in recs if r.get("name") == "slicetrace_counters")
        assert counters["plugin_dropped_PROXY_CTRL"] == 0
        # every event delivered, close's own poll's included, is in the record: the Idle/Active one and each Append;
        # every span made is in the file
        assert counters["delivered_proxy_ctrl"] == len(appends) + 1
        assert (counters["plugin_written_PROXY_CTRL"], counters["plugin_overwritten_PROXY_CTRL"]) == (len(spans), 0)


def test_without_proxy_ctrl_in_the_mask_the_trace_has_none(pool2, tmp_path):
    files = pool2.run(_run, str(tmp_path / "off"), DEFAULT_MASK)
    for path in files:
        recs = _load(path)
        assert check_trace(path) == [], path
        assert not [r for r in recs if r.get("cat") == "PROXY"]
        assert len([r for r in recs if r.get("ph") == "b" and r.get("cat") == "COLL"]) == N_AR + N_AG
        counters = next(r["args"] for r in recs if r.get("name") == "slicetrace_counters")
        assert not counters.get("delivered_proxy_ctrl")
