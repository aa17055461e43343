"""`slicetrace convert`'s send -> receive arrows as Perfetto reads them: its trace_processor's slice and flow import
(slice_tracker; flow_tracker.cc since Perfetto PR #2777, where a flow goes from whichever of its two slices began
first), simulated on the protobuf convert writes (analyze/protobuf.py's decoder; field numbers of
perfetto_trace.proto)."""
from __future__ import annotations

import json
from collections import Counter, defaultdict

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


def test_an_arrow_back_in_time_is_left_out_of_the_trace_and_the_count(tmp_path, caplog):
    """Clocks of two GPUs may disagree by more than a slice: a receive that ends before its send. Perfetto does not
    draw that arrow, yet convert counted it and wrote its ids (the send's left a flow open); it is left out now."""
    sends = [_step(0, 1, 10000, 2000), _step(0, 1, 20000, 1000, step=1)]
    recvs = [_step(1, 0, 9000, 1000), _step(1, 0, 20000, 2000, ready=21500, step=1)]
    got, slices, arrows = _convert(tmp_path, sends, recvs)
    assert got["flows"] == len(arrows) == 1
    assert "1 send -> receive arrow(s) left out: the receive ended before its send" in caplog.text
