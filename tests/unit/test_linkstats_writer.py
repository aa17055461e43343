"""The linkstats plugin's periodic writes run off the event host's lock (sinks/linkstats.py _Writer)."""
import threading

from slicetrace.config import Settings
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.sinks import linkstats as ls
from tests.unit.test_host import COMM, coll_op, recs


def test_the_periodic_write_runs_after_the_callback_returned_the_hosts_lock(tmp_path, monkeypatch):
    """It ran inside kernel_step_runs, under the host's lock: a slow filesystem held the drain, and the user's next
    op waited for the host up to BEHIND_WAIT_S and then ran unprofiled."""
    plugin = ls.LinkStatsPlugin(Settings(linkstats_file=str(tmp_path / "m"), linkstats_interval_s=1e-9))
    host = EventHost([LoadedPlugin(plugin)], COMM)
    gate, seen = threading.Event(), []
    real = ls.write_atomic

    def slow_write(path, text):             # a filesystem that answers once the test says so (or in 5 s)
        gate.wait(5)
        seen.append(host._lock.locked())
        real(path, text)
    monkeypatch.setattr(ls, "write_atomic", slow_write)
    host.begin_op(coll_op())
    host.steps(1, recs(1, 4))               # due for a periodic write: handed over, not waited for
    assert seen == []                       # the steps call returned with the write still waiting
    gate.set()
    ctx = host.plugins[0].ctx
    assert ctx.writer.idle(30) and seen == [False]
    assert 'slicetrace_link_slices_total{comm="77"' in (tmp_path / "m_77_1.prom").read_text()
    host.close()                            # the final write, once the thread ended
    assert seen == [False, True] and not ctx.writer._thread.is_alive()


def test_a_write_that_never_returns_costs_close_its_timeout_not_forever(tmp_path, monkeypatch, caplog):
    """finalize waits for the thread's write timeout_s at most, then says the final table is lost."""
    plugin = ls.LinkStatsPlugin(Settings(linkstats_file=str(tmp_path / "m"), linkstats_interval_s=1e-9,
                                         timeout_s=0.2))
    host = EventHost([LoadedPlugin(plugin)], COMM)
    gate = threading.Event()
    monkeypatch.setattr(ls, "write_atomic", lambda path, text: gate.wait(30))
    host.begin_op(coll_op())
    host.steps(1, recs(1, 4))
    try:
        host.close()
    finally:
        gate.set()
    assert any("has not returned in 0.2 s; its final table is lost" in r.getMessage() for r in caplog.records)


_AT_EXIT = """
import atexit, logging, sys, threading
from slicetrace.config import Settings
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.sinks import linkstats as ls
from tests.unit.test_host import COMM, coll_op, recs
logging.basicConfig(level=logging.ERROR)
ls._AT_EXIT_S = 0.2                     # session._finish_at_exit's budget, shortened for the test
plugin = ls.LinkStatsPlugin(Settings(linkstats_file=sys.argv[1], linkstats_interval_s=1e-9, timeout_s=600))
host = EventHost([LoadedPlugin(plugin)], COMM)
ls.write_atomic = lambda path, text: threading.Event().wait()  # a filesystem that never answers
host.begin_op(coll_op())
host.steps(1, recs(1, 4))
atexit.register(host.close)             # as _finish_at_exit closes a communicator never closed
"""


def test_a_write_that_never_returns_costs_the_exit_its_budget_not_the_communicators_timeout(tmp_path):
    """At exit (session._finish_at_exit gives all plugins 5 s) finalize still waited timeout_s (60 s by default)
    for a hung write: the process hung that long before it exited. There it waits the exit's budget at most."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "-c", _AT_EXIT, str(tmp_path / "m")], timeout=60,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join((str(root / "src"), str(root)))},
                       capture_output=True, text=True, cwd=str(root))
    assert p.returncode == 0, p.stderr
    assert "has not returned in 0.2 s; its final table is lost" in p.stderr, p.stderr


def _writes(monkeypatch):
    """write_atomic, recording each text it writes."""
    texts: list[str] = []
    real = ls.write_atomic

    def write(path, text):
        texts.append(text)
        real(path, text)
    monkeypatch.setattr(ls, "write_atomic", write)
    return texts


def _accounting(text: str) -> dict:
    from tests.helpers.prom import parse, series
    return {k[0]: v for k, v in series(parse(text), "slicetrace_profiler_accounting_total", "counter").items()}


def test_each_periodic_write_carries_the_hosts_counters_of_its_time_and_the_example_plugin_gets_them_at_close(
        tmp_path, monkeypatch):
    """The host handed its counters to plugins only at close: a live job's .prom had no overrun to alert on until
    the job ended. linkstats reads them through the host (live_counters) at each write; a plugin without
    live_counters still gets report_counters once, at close."""
    from tests.unit.test_plugin import RecPlugin
    plugin = ls.LinkStatsPlugin(Settings(linkstats_file=str(tmp_path / "m"), linkstats_interval_s=1e-9))
    rec = RecPlugin()
    host = EventHost([LoadedPlugin(plugin), LoadedPlugin(rec)], COMM)
    ctx = host.plugins[0].ctx
    texts = _writes(monkeypatch)
    host.drop("overrun", 5)
    host.begin_op(coll_op())
    host.steps(1, recs(1, 4))
    assert ctx.writer.idle(30) and _accounting(texts[-1])["overrun"] == 5
    host.drop("overrun", 2)
    host.steps(1, recs(1, 4, t0=9000))
    assert ctx.writer.idle(30) and _accounting(texts[-1])["overrun"] == 7
    assert _accounting(texts[-1])["delivered_kernel_step"] >= 4       # its own deliveries, as they were then
    assert not [c for c in rec.calls if c[0] == "counters"]
    host.close()
    assert _accounting(texts[-1])["delivered_kernel_step"] == 8
    assert [c[1]["overrun"] for c in rec.calls if c[0] == "counters"] == [7]


def test_an_idle_communicators_file_is_rewritten_every_interval_with_live_counters_until_close(tmp_path, monkeypatch):
    """The file was rewritten only as KernelSteps arrived: an idle job's file looked stale by its mtime, which the
    README suggests for clearing old files. Now it is rewritten every interval while open, no more often than that,
    and no more once closed."""
    import time
    monkeypatch.setattr(ls, "_IDLE_MIN_S", 0.0, raising=False)
    texts = _writes(monkeypatch)
    plugin = ls.LinkStatsPlugin(Settings(linkstats_file=str(tmp_path / "m"), linkstats_interval_s=0.2))
    host = EventHost([LoadedPlugin(plugin)], COMM)
    ctx = host.plugins[0].ctx
    host.drop("consumer_behind", 3)                 # no op at all: only the timer writes
    t0, end = time.monotonic(), time.monotonic() + 30
    while len(texts) < 4 and time.monotonic() < end:
        time.sleep(0.01)
    took = time.monotonic() - t0
    assert len(texts) >= 4, "an idle communicator's file was not rewritten"
    assert len(texts) <= took / 0.2 + 2             # each write starts 0.2 s after the one before at the earliest
    assert _accounting(texts[-1])["consumer_behind"] == 3
    host.close()
    assert not ctx.writer._thread.is_alive()


def test_a_sub_second_interval_does_not_make_an_idle_writer_spin(tmp_path, monkeypatch):
    """An interval of 1 ns means 'as KernelSteps arrive'; while none arrive the file is rewritten once a second."""
    import time
    texts = _writes(monkeypatch)
    plugin = ls.LinkStatsPlugin(Settings(linkstats_file=str(tmp_path / "m"), linkstats_interval_s=1e-9))
    ctx = plugin.init(COMM, ls.ActivationMask())
    time.sleep(0.3)
    assert len(texts) <= 1
    plugin.finalize(ctx)
    assert not ctx.writer._thread.is_alive()
