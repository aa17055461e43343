"""`slicetrace convert`'s send -> receive arrows as Perfetto reads them: its trace_processor's slice and flow import
(slice_tracker; flow_tracker.cc since Perfetto PR #2777, where a flow goes from whichever of its two slices began
first), simulated on the protobuf convert writes (analyze/protobuf.py's decoder; field numbers of
perfetto_trace.proto)."""
from __future__ import annotations

import json
from collections import Counter, defaultdict

import numpy as np
import pytest

from slicetrace.analyze.perfetto import convert, wire_fields


def _step(rank: int, is_send: int, t0: int, dur: int, ready: int | None = None, step: int = 0) -> dict:
    """A KernelStep of rank 0 -> 1 (ns): it waits from t0, its data is there at `ready` (default: at its end)."""
    ready = t0 + dur if ready is None else ready
    return {"name": "KernelStep", "cat": "GPU", "ph": "X", "pid": rank, "tid": 1, "ts": t0 / 1000, "dur": dur / 1000,
            "args": {"Channel": 0, "IsSend": is_send, "Peer": 1 - rank, "Step": step, "Size": 8, "WaitGpuClk": 0,
                     "StartGpuClk": ready - t0, "StopGpuClk": dur}}


def _convert(tmp_path, sends: list[dict], recvs: list[dict]) -> tuple[dict, list, list]:
    """convert of the two ranks' steps -> its summary, the slices and the arrows trace_processor would make."""
    paths = [str(tmp_path / f"t_7_{r}.json") for r in (0, 1)]
    for path, recs in zip(paths, (sends, recvs)):
        with open(path, "w") as f:
            json.dump(recs, f)
    out = tmp_path / "x.pftrace"
    got = convert(paths, str(out))
    return (got, *_import(out))


def _fields(buf: bytes) -> dict[int, list]:
    out: dict[int, list] = defaultdict(list)
    for f, v in wire_fields(buf):
        out[f].append(v)
    return out


def _import(path) -> tuple[list[dict], list[tuple[dict, dict]]]:
    """trace_processor's import, as far as slices and flows go. Events by timestamp (file order among equal ones): a
    begin opens a slice on its track, an end closes the track's open one, an instant is a slice of its own inside
    it. A flow starts at the slice of the event carrying its id in flow_ids; a terminating id met while its flow is
    not started is dropped; the arrow goes from the slice that began first (the starting one on a tie). Asserts that
    slices never nest (lanes), that each instant lies in an open slice and each id starts and ends once."""
    events = []
    for _, pkt in wire_fields(path.read_bytes()):
        p = _fields(pkt)
        if 11 in p:
            events.append((p[8][0], _fields(p[11][0])))
    assert [ts for ts, _ in events] == sorted(ts for ts, _ in events)
    open_on: dict[int, list] = defaultdict(list)
    slices, arrows, active, ids = [], [], {}, Counter()
    for ts, te in events:
        stack = open_on[te[11][0]]
        if te[9][0] == 2:
            s = stack.pop()
            s["end"] = ts
        else:
            args = {(d := _fields(a))[10][0].decode(): d[4][0] for a in te[4]}
            s = {"ts": ts, "end": ts, "name": te[23][0].decode(), "args": args, "in": stack[-1] if stack else None}
            slices.append(s)
            if te[9][0] == 1:
                assert not stack
                stack.append(s)
            else:
                assert te[9][0] == 3 and s["in"] is not None
        ids.update((f, 47) for f in te[47])
        ids.update((f, 48) for f in te[48])
        for f in te[47]:
            active[f] = s
        for f in te[48]:
            src = active.pop(f, None)
            if src is not None:
                arrows.append((s, src) if src["ts"] > s["ts"] else (src, s))
    assert not any(open_on.values()) and not active and set(ids.values()) <= {1}
    assert len(ids) == 2 * len(arrows)
    return slices, arrows


def _check_arrow(src: dict, dst: dict) -> None:
    """From the send's instant at its done to the receive's instant at its ready, in the two slices of one step."""
    assert (src["name"], dst["name"]) == ("send done", "recv ready")
    assert (src["in"]["args"]["IsSend"], dst["in"]["args"]["IsSend"], src["ts"]) == (1, 0, src["in"]["end"])
    assert dst["in"]["ts"] <= dst["ts"] <= dst["in"]["end"] and src["ts"] <= dst["ts"]
    assert src["in"]["args"]["Step"] == dst["in"]["args"]["Step"]


def test_an_arrow_goes_from_the_send_when_its_receive_began_first(tmp_path):
    """The receiver waits: its slice begins before the send's. Flow ids on the slices' ends made Perfetto (since
    PR #2777: the slice that began first is the source) draw the arrow receive -> send, 22 % of a 4-rank run's.
    They are on instants now: the send's when it was done, the receive's when its data was ready."""
    got, slices, arrows = _convert(tmp_path, [_step(0, 1, 9000, 1500)], [_step(1, 0, 5000, 7000, ready=11000)])
    assert got["flows"] == len(arrows) == 1
    src, dst = arrows[0]
    _check_arrow(src, dst)
    assert (src["ts"], dst["ts"]) == (10500, 11000)


@pytest.mark.parametrize("send, recv", [
    ((10000, 0), (9000, 1000, 10000)),          # zero-length send; the receive ready at its end, that ns
    ((10000, 0), (10000, 0, 10000)),            # both zero-length
    ((9000, 1000), (10000, 1000, 10000)),       # the receive begins, ready, when the send is done
    ((9000, 1000), (8000, 2000, 10000)),        # the receive ready at its end, when the send's ends
    ((9000, 1000), (8000, 4000, 10000))])       # ... within the receive
def test_instants_at_one_ns_nest_in_their_slices_and_start_before_they_end(tmp_path, send, recv):
    """At one ns the send's instant comes first (trace_processor drops a terminating id met before its start), each
    instant inside its own slice: not after its end, not before its begin, not in the next slice of the lane,
    which begins there (step 1)."""
    sends = [_step(0, 1, *send), _step(0, 1, 10000, 500, step=1)]
    recvs = [_step(1, 0, *recv[:2], ready=recv[2]), _step(1, 0, 11000, 500, step=1)]
    got, slices, arrows = _convert(tmp_path, sends, recvs)
    assert got["flows"] == len(arrows) == 2
    for src, dst in arrows:
        _check_arrow(src, dst)
    assert sorted(s["in"]["args"]["Step"] for s, _ in arrows) == [0, 1]


def test_every_arrow_goes_send_to_receive_on_many_slices_sharing_ns(tmp_path):
    """300 steps on a 64 ns grid (many ties, zero-length slices, overlaps put on lanes), each receive beginning
    before or after its send, ready when or after the send was done (the shared clock's rule)."""
    rng = np.random.default_rng(7)
    sends, recvs, ready = [], [], {}
    for step in range(300):
        t0 = step * 640 + int(rng.integers(0, 40)) * 64
        dur = int(rng.integers(0, 40)) * 64 * int(rng.integers(0, 2))           # half of them zero-length
        r0 = t0 + int(rng.integers(-20, 20)) * 64
        ready[step] = max(t0 + dur, r0) + int(rng.integers(0, 2)) * 64
        r1 = ready[step] + int(rng.integers(0, 3)) * 64
        r0 = min(r0, ready[step])
        sends.append(_step(0, 1, t0, dur, step=step))
        recvs.append(_step(1, 0, r0, r1 - r0, ready=ready[step], step=step))
    got, slices, arrows = _convert(tmp_path, sends, recvs)
    assert got["flows"] == len(arrows) == 300 and got["tracks"] > 2
    for src, dst in arrows:
        _check_arrow(src, dst)
        assert dst["ts"] == ready[dst["in"]["args"]["Step"]]
    assert sum(r["ts"] < s["ts"] for s, r in zip(sends, recvs)) > 100      # receives that began first
    assert sum(src["ts"] == dst["ts"] for src, dst in arrows) > 50           # ready the ns the send was done


def test_an_arrow_back_in_time_is_left_out_of_the_trace_and_the_count(tmp_path, caplog):
    """Clocks of two GPUs may disagree by more than a slice: a receive ready before its send was done. Perfetto cannot
    draw that arrow (it drops a terminating id met before its start): left out of the trace and the count, said so."""
    sends = [_step(0, 1, 10000, 2000), _step(0, 1, 20000, 1000, step=1)]
    recvs = [_step(1, 0, 9000, 1000), _step(1, 0, 20000, 2000, ready=21500, step=1)]
    got, slices, arrows = _convert(tmp_path, sends, recvs)
    assert got["flows"] == len(arrows) == 1
    assert "1 send -> receive arrow(s) left out: the receive ended before its send was done" in caplog.text
    assert [s["in"]["args"]["Step"] for s in slices if s["in"]] == [1, 1]      # its instants only


def test_a_receive_ready_a_few_ns_before_its_send_was_done_keeps_its_arrow(tmp_path, caplog):
    """Two GPUs' clocks a few ns apart put a receive's ready before its send's done: the arrow was left out (and
    warned of) though the receive lasted past the send; its instant moves to the send's done, inside the receive."""
    got, slices, arrows = _convert(tmp_path, [_step(0, 1, 10000, 2000)], [_step(1, 0, 9000, 4000, ready=11995)])
    assert got["flows"] == len(arrows) == 1 and "left out" not in caplog.text
    src, dst = arrows[0]
    _check_arrow(src, dst)
    assert (src["ts"], dst["ts"]) == (12000, 12000)
