"""sinks.chrome on a full disk: a write that fails half-way must not leave a cut record that later appends bury
in the middle of the JSON array; what was not written is counted, and finalize and bench's note say so."""
from __future__ import annotations

import errno
import json
import logging
import types

import pytest

from slicetrace.analyze.records import read_records
from slicetrace.cli.outputs import dump_files, trace_note
from slicetrace.config import Settings
from slicetrace.errors import SliceTraceError
from slicetrace.events import abi
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.events.synthetic import SyntheticSource, deliver
from slicetrace.sinks import chrome_store, chrome_writer
from slicetrace.sinks.chrome import ChromePlugin

COMM = abi.CommInfo(4242, "t", 1, 4, 1)
POOLS = {"KERNEL_STEP": 16, "KERNEL_CH": 4, "COLL": 2, "P2P": 2}     # small: many appends


class FillsUp:
    """A trace file whose `fail_at`-th write writes half its bytes, then fails as on a full disk; later writes
    succeed (another process freed space): an append after the cut record would spoil the whole array."""

    def __init__(self, f, fail_at):
        self.f, self.n, self.fail_at = f, 0, fail_at

    def write(self, data):
        self.n += 1
        mv = memoryview(data).cast("B")
        if self.n == self.fail_at:
            self.f.write(mv[:len(mv) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.f.write(mv)

    def __getattr__(self, name):
        return getattr(self.f, name)


def _run(tmp_path, monkeypatch, fail_at):
    """Synthetic ops through the host into a file that fills up; (plugin, ctx, path, files before the run)."""
    real_open = open

    def opener(path, *a, **kw):
        return FillsUp(real_open(path, *a, **kw), fail_at)
    monkeypatch.setattr(chrome_store, "open", opener, raising=False)
    before = dump_files(str(tmp_path))
    p = ChromePlugin(Settings(profile_dump_file=str(tmp_path / "trace"), pool_sizes=POOLS))
    host = EventHost([LoadedPlugin(p)], COMM)
    ctx = host.plugins[0].ctx
    src = SyntheticSource(nranks=4, rank=1, nchannels=2, loops=2, funcs=("all_reduce", "send_recv"), seed=3)
    for op in src.ops(8):
        op.info.mask = host.op_mask()
        host.begin_op(op.info)
        deliver(host, op, batch=5)
    return p, host, ctx, before


def test_a_write_cut_half_way_leaves_whole_records_counts_the_rest_lost_and_finalize_raises(tmp_path, monkeypatch,
                                                                                            caplog):
    p, host, ctx, before = _run(tmp_path, monkeypatch, fail_at=5)
    path = ctx.path
    with caplog.at_level(logging.WARNING, logger="slicetrace"):
        host.close()                       # the host logs the plugin's failure in finalize
    finalize_log = caplog.text
    # the file: "[", whole records one per line, nothing after the last whole one (no cut record, no later append)
    text = open(path, encoding="utf-8").read()
    lines = text.split("\n")
    assert lines[0] == "[" and lines[-1] == "" and all(line.endswith(",") for line in lines[1:-1])
    whole = [json.loads(line[:-1]) for line in lines[1:-1]]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="slicetrace"):
        got = read_records(path)                                     # readable, as cut short
    assert [(r["name"], r.get("ts")) for r in got] == [(r["name"], r.get("ts")) for r in whole]
    assert "was cut short" in caplog.text
    assert "failed in finalize" in finalize_log and "No space left on device" in finalize_log
    # every completed record is counted once: written (and in the file) or lost
    c = p.counters(ctx)
    steps = sum(r.get("name") == "KernelStep" for r in whole)
    assert c["plugin_written_KERNEL_STEP"] == steps and c["plugin_lost_KERNEL_STEP"] > 0
    delivered = host.counters()
    for pool in ("KERNEL_STEP", "KERNEL_CH", "COLL", "P2P"):
        assert c[f"plugin_written_{pool}"] + c[f"plugin_lost_{pool}"] == delivered[f"delivered_{pool.lower()}"], pool
    # bench's note does not call it written
    with pytest.raises(SliceTraceError, match=r"1 of the 1 trace file\(s\) this run wrote are incomplete"):
        trace_note(str(tmp_path), before, "example", None)


def test_finalize_raises_naming_the_file_and_what_was_lost(tmp_path, monkeypatch):
    p, host, ctx, _ = _run(tmp_path, monkeypatch, fail_at=3)
    with pytest.raises(OSError) as e:
        p.finalize(ctx)
    msg = str(e.value)
    assert e.value.errno == errno.ENOSPC and ctx.path in msg and "KERNEL_STEP" in msg and "lost" in msg
    assert ctx.done and ctx.file.closed
    p.finalize(ctx)                        # done: not raised twice
    host.close()


def test_a_trace_that_was_written_whole_is_named_by_the_note(tmp_path, monkeypatch):
    p, host, ctx, before = _run(tmp_path, monkeypatch, fail_at=10**9)
    host.close()
    assert read_records(ctx.path)[-1]["name"] == "slicetrace_counters"
    assert "trace_4242_<rank>.json (1 file(s)" in trace_note(str(tmp_path), before, "example", None)


def test_another_runs_trace_still_being_written_beside_ours_is_not_called_incomplete(tmp_path, monkeypatch):
    """A second job writing into the same --trace folder made a successful bench fail ('1 of the 2 trace file(s)
    this run wrote are incomplete'): a file that still grows is another writer's, not a broken one."""
    from slicetrace.cli import outputs
    p, host, ctx, before = _run(tmp_path, monkeypatch, fail_at=10**9)
    host.close()
    other = tmp_path / "trace_777_0.json"
    other.write_text('[\n{"name":"slicetrace_comm"},\n')
    waits = []

    clock = [0.0]

    def grow(seconds):          # trace_note's wait for growth: the other writer appends meanwhile, for certain
        waits.append(seconds)
        clock[0] += seconds
        with open(other, "a") as f:
            f.write('{"name":"x"},\n')
    # outputs' time only, on a clock that its sleeps advance
    monkeypatch.setattr(outputs, "time", types.SimpleNamespace(sleep=grow, monotonic=lambda: clock[0]))
    note = trace_note(str(tmp_path), before, "example", None)
    assert waits, "trace_note never waited to see whether the unfinished file grows"
    assert "trace_4242_<rank>.json" in note


def test_a_ranks_last_write_landing_late_is_waited_for_not_called_cut_short(tmp_path, monkeypatch):
    """Under CI's load a bench interrupted with SIGTERM said its trace was 'cut short when the run failed' (one look
    0.3 s later): a file whose closing write lands within the wait is finished; one that stays open is named."""
    from slicetrace.cli import outputs
    p, host, ctx, before = _run(tmp_path, monkeypatch, fail_at=10**9)
    host.close()
    whole = open(ctx.path, "rb").read()
    cut = tmp_path / "trace_4242_7.json"
    cut.write_bytes(whole[:whole.rindex(b"]")])             # open, as while its rank writes its last records
    stays_open = tmp_path / "trace_4242_8.json"
    stays_open.write_bytes(whole[:whole.rindex(b"]")])
    clock, sleeps = [0.0], []

    def sleep(seconds):
        sleeps.append(seconds)
        clock[0] += seconds
        if len(sleeps) == 5:                                 # 0.25 s in: the late write lands
            with open(cut, "ab") as f:
                f.write(b"]\n")
    monkeypatch.setattr(outputs, "time", types.SimpleNamespace(sleep=sleep, monotonic=lambda: clock[0]))
    note = trace_note(str(tmp_path), before, "example", None, failed=True)
    assert "(3 file(s), cut short when the run failed: " in note, note
    assert str(stays_open) in note and str(cut) not in note
    assert 0.5 <= clock[0] < 1.0                            # waited for the open one to stay unchanged, no longer
    with pytest.raises(SliceTraceError, match=r"1 of the 3 trace file\(s\) this run wrote are incomplete"):
        trace_note(str(tmp_path), before, "example", None)


def test_a_slow_file_does_not_hold_the_callback_that_filled_a_buffer(tmp_path, monkeypatch, caplog):
    """The example plugin wrote a full buffer inside the callback that filled it, under the host's lock: a million
    KernelSteps (about a second to format and write) held the user's thread at begin_op for the host's 1 s wait,
    and the ops behind went unprofiled (consumer_behind). A writer thread appends now; here the file's writes
    block until released, and every op is still begun, delivered and ended, then written whole at close."""
    import threading
    real_open, gate = open, threading.Event()

    class Blocks:
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, data):
            self.n += 1
            if self.n > 1:                  # the first record goes at init; every later write waits for the gate
                assert gate.wait(60), "never released"
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)
    monkeypatch.setattr(chrome_store, "open", lambda path, *a, **kw: Blocks(real_open(path, *a, **kw)),
                        raising=False)
    # 448 KernelSteps: one full buffer (256) goes to the writer during the loop, within its one-pool queue
    p = ChromePlugin(Settings(profile_dump_file=str(tmp_path / "trace"), pool_sizes={**POOLS, "KERNEL_STEP": 256}))
    host = EventHost([LoadedPlugin(p)], COMM)
    ctx = host.plugins[0].ctx
    src = SyntheticSource(nranks=4, rank=1, nchannels=2, loops=2, funcs=("all_reduce", "send_recv"), seed=3)

    def ops():
        for op in src.ops(8):
            op.info.mask = host.op_mask()
            host.begin_op(op.info)
            deliver(host, op, batch=5)
    t = threading.Thread(target=ops, daemon=True)
    t.start()
    t.join(10)
    done = not t.is_alive()
    gate.set()                              # release the writes (and a callback stuck in one, on the old code)
    t.join(60)
    assert done, "the op loop waited for the file"
    with caplog.at_level(logging.INFO, logger="slicetrace"):
        host.close()
    assert f"slicetrace example plugin rank 1: wrote {ctx.path} (448 KernelSteps, " in caplog.text   # launch()'s users
    recs = read_records(ctx.path)
    c = recs[-1]["args"]
    assert recs[-1]["name"] == "slicetrace_counters" and host.counters()["consumer_behind"] == 0
    for pool in ("KERNEL_STEP", "KERNEL_CH", "COLL", "P2P"):
        assert c[f"plugin_lost_{pool}"] == 0 and c[f"plugin_written_{pool}"] == c[f"delivered_{pool.lower()}"] > 0
    assert c["plugin_written_KERNEL_STEP"] == sum(r.get("name") == "KernelStep" for r in recs)
    assert not [th for th in threading.enumerate() if th.name.startswith("slicetrace-trace")]


def _stalled_run(tmp_path, monkeypatch, gate, at: int):
    """Synthetic ops into a file whose at-th write blocks on `gate` (a hung filesystem)."""
    real_open = open

    class Stalls:
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, data):
            self.n += 1
            if self.n == at:
                gate.wait(60)
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)
    monkeypatch.setattr(chrome_store, "open", lambda path, *a, **kw: Stalls(real_open(path, *a, **kw)), raising=False)
    p = ChromePlugin(Settings(profile_dump_file=str(tmp_path / "trace"), pool_sizes=POOLS))
    host = EventHost([LoadedPlugin(p)], COMM)
    src = SyntheticSource(nranks=4, rank=1, nchannels=2, loops=2, funcs=("all_reduce", "send_recv"), seed=3)
    return p, host, src


def test_a_hung_disk_costs_one_wait_and_what_it_never_wrote_is_counted_lost(tmp_path, monkeypatch, caplog):
    """With the writer stuck, every full buffer waited the whole room timeout again under the host's lock (13 s for
    8 ops at 0.5 s each), and a close that timed out left the queued records neither written nor lost."""
    import threading
    monkeypatch.setattr(chrome_store, "_ROOM_S", 0.5)
    monkeypatch.setattr(chrome_store, "_CLOSE_S", 1.0)
    timed_out = []                          # per full buffer's room(): slept on the writer, then gave up
    real_room = chrome_writer.Writer.room

    def room(self, rows, timeout_s):
        me, real_wait, slept = threading.get_ident(), self._cv.wait, []

        def wait(timeout=None):             # counted, not timed; the writer thread's own waits are not
            if threading.get_ident() == me:
                slept.append(timeout)
            return real_wait(timeout)
        self._cv.wait = wait
        try:
            ok = real_room(self, rows, timeout_s)
        finally:
            del self._cv.wait
        timed_out.append(bool(slept) and not ok)
        return ok
    monkeypatch.setattr(chrome_writer.Writer, "room", room)
    gate = threading.Event()
    p, host, src = _stalled_run(tmp_path, monkeypatch, gate, at=3)
    ctx = host.plugins[0].ctx
    with caplog.at_level(logging.WARNING, logger="slicetrace"):
        for op in src.ops(8):
            op.info.mask = host.op_mask()
            host.begin_op(op.info)
            deliver(host, op, batch=5)
        host.close()
    gate.set()                              # the hung write returns into a closed file: its job counts the rest
    for th in [th for th in threading.enumerate() if th.name.startswith("slicetrace-trace")]:
        th.join(10)
        assert not th.is_alive()
    # one full buffer waits the room timeout out, the later ones go on at once (13 s for these 8 ops before)
    assert len(timed_out) > 2 and sum(timed_out) == 1, timed_out
    assert caplog.text.count("more than a pool of KernelSteps behind") == 1
    assert "did not finish within 1 s" in caplog.text
    c = p.counters(ctx)
    delivered = host.counters()
    for pool in ("KERNEL_STEP", "KERNEL_CH", "COLL", "P2P"):       # every record once, written or lost
        assert c[f"plugin_written_{pool}"] + c[f"plugin_lost_{pool}"] == delivered[f"delivered_{pool.lower()}"], pool


def test_a_stuck_writer_queues_a_few_pools_of_kernel_steps_then_drops_and_counts_them(tmp_path, monkeypatch, caplog):
    """A hung disk made the queue of KernelSteps for the writer grow with every op for as long as the run went on
    (memory without bound: a long job's rank would be killed for it). Now it holds _STUCK_POOLS pools; later ones
    are dropped while the writer is stuck, said once and counted lost, and every record is still written or lost."""
    import threading
    monkeypatch.setattr(chrome_store, "_ROOM_S", 0.2)
    monkeypatch.setattr(chrome_store, "_CLOSE_S", 1.0)
    gate = threading.Event()
    p, host, src = _stalled_run(tmp_path, monkeypatch, gate, at=3)
    ctx = host.plugins[0].ctx
    queued, delivered_steps = [], 0
    with caplog.at_level(logging.WARNING, logger="slicetrace"):
        for op in src.ops(60):
            op.info.mask = host.op_mask()
            host.begin_op(op.info)
            deliver(host, op, batch=5)
            queued.append(ctx.pending("KERNEL_STEP"))
            delivered_steps = host.counters()["delivered_kernel_step"]
        lost_in_run = ctx.lost["KERNEL_STEP"]
        host.close()
    gate.set()
    for th in [th for th in threading.enumerate() if th.name.startswith("slicetrace-trace")]:
        th.join(10)
        assert not th.is_alive()
    pool = POOLS["KERNEL_STEP"]
    assert delivered_steps > 8 * pool                       # enough to pass the bound twice over
    assert max(queued) <= chrome_store._STUCK_POOLS * pool, queued
    assert lost_in_run > 0 and ctx.dropped_stuck == lost_in_run
    assert caplog.text.count("later ones are dropped while it is") == 1
    c = p.counters(ctx)
    delivered = host.counters()
    for pool_name in ("KERNEL_STEP", "KERNEL_CH", "COLL", "P2P"):      # every record once, written or lost
        assert (c[f"plugin_written_{pool_name}"] + c[f"plugin_lost_{pool_name}"]
                == delivered[f"delivered_{pool_name.lower()}"]), pool_name


def test_a_formatting_failure_counts_what_it_did_not_write_and_ends_the_file(tmp_path, monkeypatch):
    """A job that raised other than through the file (MemoryError formatting a block) lost its rows uncounted and
    later jobs appended after the gap."""
    from slicetrace.sinks import chrome_text
    real, calls = chrome_text.RowFormat.__call__, [0]

    def flaky(self, cols):
        calls[0] += 1
        if calls[0] == 3:
            raise MemoryError("np.column_stack")
        return real(self, cols)
    monkeypatch.setattr(chrome_text.RowFormat, "__call__", flaky)
    p, host, ctx, _ = _run(tmp_path, monkeypatch, fail_at=10**9)
    with pytest.raises(OSError, match=r"formatting the records failed: MemoryError"):
        p.finalize(ctx)
    c = p.counters(ctx)
    delivered = host.counters()
    for pool in ("KERNEL_STEP", "KERNEL_CH", "COLL", "P2P"):
        assert c[f"plugin_written_{pool}"] + c[f"plugin_lost_{pool}"] == delivered[f"delivered_{pool.lower()}"], pool
    assert sum(r.get("name") == "KernelStep" for r in read_records(ctx.path)) == c["plugin_written_KERNEL_STEP"]
    host.close()


def test_a_writer_that_moves_again_is_waited_for_again():
    """After one timed-out wait, a full buffer never waited again: on a slow disk that still moved, the queue grew
    past any bound (310 rows queued against a limit of 10)."""
    import threading
    import time

    from slicetrace.sinks.chrome_writer import Writer
    w, gate = Writer("slicetrace-trace-test", 10), threading.Event()
    w.put(lambda: gate.wait(30), "KERNEL_STEP", 10)
    assert w.room(5, 0.05) is False and w.stuck                 # the disk hangs: one wait, then none
    assert w.room(5, 30) is False
    gate.set()
    for _ in range(3000):                                       # the job ends: the writer moved
        if not w.pending("KERNEL_STEP"):
            break
        time.sleep(0.01)
    assert not w.stuck
    gate.clear()
    w.put(lambda: gate.wait(30), "KERNEL_STEP", 10)
    threading.Timer(0.2, gate.set).start()
    assert w.room(5, 30) is True and not w.stuck                # waited for again, and room found
    w.put(lambda: gate.wait(30), "KERNEL_STEP", 10)
    assert w.close(10) and w.pending("KERNEL_STEP") == 0


def test_records_whose_text_cannot_be_encoded_are_counted_lost(tmp_path):
    """A MemoryError encoding a buffer of op records (before its write) left them counted nowhere."""
    class Unencodable(str):
        def encode(self, *a, **kw):
            raise MemoryError("encode")
    p = ChromePlugin(Settings(profile_dump_file=str(tmp_path / "trace"), pool_sizes=POOLS))
    ctx = p.init(COMM, abi.ActivationMask())
    ctx.write(Unencodable("x"), "COLL", 5)
    with pytest.raises(OSError, match=r"formatting the records failed: MemoryError\('encode'\)"):
        p.finalize(ctx)
    assert ctx.lost["COLL"] == 5 and ctx.written["COLL"] == 0
