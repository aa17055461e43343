"""Error paths of teardown: Session.close and Session.__init__, EventHost.__init__, ChromePlugin.finalize.

Whatever fails, the plugins are finalized (their files closed and complete) and the backend is closed; the first
error is the one raised (what does not return at all: test_close_stuck.py). In-process: fake backends, drains and
plugins, no rank processes.
"""
from __future__ import annotations

import errno
import json
import logging

import pytest

import slicetrace.session as session_mod
from slicetrace.backend.null import NullBackend
from slicetrace.config import Settings
from slicetrace.errors import BackendError, CommTimeoutError, ConfigError, UsageError
from slicetrace.events import abi
from slicetrace.events.host import EventHost
from slicetrace.events.loading import load_plugins
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.rendezvous import DictStore
from slicetrace.sinks.chrome import ChromePlugin
from tests.unit.test_plugin import RecPlugin

COMM = abi.CommInfo(4242, "t", 1, 2, 1)


class Backend(NullBackend):
    """Records close; raises where asked (close, clock_sync) and reports messages never received if asked."""

    def __init__(self, *a, calls=None, close_error=None, sync_error=None, lost=(), **k):
        super().__init__(*a, **k)
        self.calls = calls if calls is not None else []
        self.close_error, self.sync_error, self.lost = close_error, sync_error, list(lost)

    def clock_sync(self):
        if self.sync_error is not None:
            raise self.sync_error
        return super().clock_sync()

    def close(self):
        self.calls.append("backend.close")
        super().close()
        if self.close_error is not None:
            raise self.close_error

    def unreceived(self):
        return self.lost


class FakeDrain:
    """What Session.close uses of a drain; flush raises if asked; `alive` = its thread outlived stop()."""
    settled = True

    def __init__(self, calls, flush_error=None, alive=False):
        self.calls, self.flush_error, self.alive, self.error = calls, flush_error, alive, None

    def fence(self, timeout_s):
        return not self.alive

    def flush(self, timeout_s):
        self.calls.append("drain.flush")
        if self.flush_error is not None:
            raise self.flush_error
        return True

    def stop(self, timeout_s=5.0):
        self.calls.append("drain.stop")

    def release(self):
        pass


class Rec(RecPlugin):
    def __init__(self, calls, **kw):
        super().__init__(**kw)
        self.log = calls

    def finalize(self, ctx):
        self.log.append("plugin.finalize")
        super().finalize(ctx)


def _session(monkeypatch, plugins, **backend_kw):
    calls = backend_kw.setdefault("calls", [])
    monkeypatch.setattr(session_mod, "create", lambda s, r, w, st, j: Backend(s, r, w, st, j, **backend_kw))
    monkeypatch.setattr(session_mod, "load_plugins", lambda spec, s, source: [LoadedPlugin(p) for p in plugins])
    s = session_mod.Session(Settings(backend="null", nchannels=1, profiler_plugin="rec"), 0, 1, DictStore({}), "cl")
    return s, calls


def _with_drain(monkeypatch, **kw):
    """A session whose drain is a FakeDrain; returns it, the ordered calls and the plugin."""
    calls: list[str] = []
    rec = Rec(calls)
    s, _ = _session(monkeypatch, [rec], calls=calls, **{k: v for k, v in kw.items() if k != "drain"})
    s.drain = FakeDrain(calls, **kw.get("drain", {}))
    return s, calls, rec


# ---- Session.close ----

def test_a_failed_flush_still_stops_the_drain_finalizes_the_plugins_and_closes_the_backend(monkeypatch):
    err = CommTimeoutError("fetch timed out")
    s, calls, rec = _with_drain(monkeypatch, drain={"flush_error": err})
    with pytest.raises(CommTimeoutError) as ei:
        s.close()
    assert ei.value is err
    assert calls == ["drain.flush", "drain.stop", "plugin.finalize", "backend.close"]
    assert rec.of("counters"), "report_counters runs before finalize"
    s.close()                                           # idempotent: nothing runs twice
    assert calls.count("backend.close") == 1


def test_the_first_error_wins_and_later_ones_are_logged(monkeypatch, caplog):
    first = BackendError("flush failed")
    s, calls, _ = _with_drain(monkeypatch, drain={"flush_error": first}, close_error=RuntimeError("close failed"),
                              lost=["2 messages from rank 1"])
    with caplog.at_level(logging.ERROR, logger="slicetrace"), pytest.raises(BackendError) as ei:
        s.close()
    assert ei.value is first                            # not the backend's error, not the UsageError
    assert calls[-2:] == ["plugin.finalize", "backend.close"]
    assert "close failed" in caplog.text


def test_unreceived_messages_are_an_error_when_nothing_else_failed(monkeypatch):
    s, calls, _ = _with_drain(monkeypatch, lost=["2 messages from rank 1"])
    with pytest.raises(UsageError, match="never received"):
        s.close()
    assert calls == ["drain.flush", "drain.stop", "plugin.finalize", "backend.close"]


def test_a_drain_thread_that_outlives_stop_is_logged_and_the_rest_still_closes(monkeypatch, caplog):
    s, calls, _ = _with_drain(monkeypatch, drain={"alive": True})
    with caplog.at_level(logging.ERROR, logger="slicetrace"):
        s.close()                                       # not an error by itself
    assert calls == ["drain.flush", "drain.stop", "plugin.finalize", "backend.close"]
    assert "did not stop" in caplog.text


def test_a_failed_flush_leaves_a_complete_trace(monkeypatch, tmp_path):
    """The example plugin through a real Session: its file gets the closing bracket and counters."""
    calls: list[str] = []
    plugin = ChromePlugin(Settings(profile_dump_file=str(tmp_path / "t")))
    s, _ = _session(monkeypatch, [plugin], calls=calls)
    s.drain = FakeDrain(calls, flush_error=CommTimeoutError("fetch timed out"))
    with pytest.raises(CommTimeoutError):
        s.close()
    (path,) = tmp_path.glob("t_*.json")
    with open(path) as f:
        data = json.load(f)
    assert data[-1]["name"] == "slicetrace_counters"


# ---- Session.__init__ ----

@pytest.mark.parametrize("where", ["clock_sync", "drain"])
def test_a_failure_after_the_plugins_initialised_finalizes_them_and_closes_the_backend(monkeypatch, where):
    calls: list[str] = []
    err = BackendError(f"{where} failed")
    if where == "drain":
        def no_drain(*a, **k):
            raise err
        monkeypatch.setattr(session_mod, "Drain", no_drain)
    with pytest.raises(BackendError) as ei:
        _session(monkeypatch, [Rec(calls)], calls=calls, sync_error=err if where == "clock_sync" else None)
    assert ei.value is err
    assert calls == ["plugin.finalize", "backend.close"]


def test_an_init_failure_while_tearing_down_is_logged_and_the_first_error_raised(monkeypatch, caplog):
    calls: list[str] = []
    err = BackendError("clock_sync failed")
    with caplog.at_level(logging.ERROR, logger="slicetrace"), pytest.raises(BackendError) as ei:
        _session(monkeypatch, [Rec(calls)], calls=calls, sync_error=err, close_error=RuntimeError("close failed"))
    assert ei.value is err and calls == ["plugin.finalize", "backend.close"]
    assert "close failed" in caplog.text


# ---- EventHost.__init__ ----

class Refusing(RecPlugin):
    def init(self, comm, mask):
        raise ConfigError("dump path cannot be written")


def test_a_config_error_finalizes_the_plugins_initialised_before_it():
    calls: list[str] = []
    first, later = Rec(calls), Rec(calls)
    lps = [LoadedPlugin(first), LoadedPlugin(Refusing()), LoadedPlugin(later)]
    with pytest.raises(ConfigError):
        EventHost(lps, COMM)
    assert calls == ["plugin.finalize"]                 # the first only: the later one never initialised
    assert not lps[0].initialized and not lps[2].initialized


def test_an_unwritable_linkstats_file_leaves_the_example_trace_closed_and_complete(tmp_path):
    (tmp_path / "afile").write_text("")                 # a file where linkstats needs a folder
    s = Settings(profiler_plugin="example,linkstats", profile_dump_file=str(tmp_path / "t"),
                 linkstats_file=str(tmp_path / "afile" / "ls"))
    lps = load_plugins(s.profiler_plugin, s)
    with pytest.raises(ConfigError, match="linkstats_file"):
        EventHost(lps, COMM)
    assert lps[0].ctx.file.closed
    with open(lps[0].ctx.path) as f:
        assert json.load(f)[-1]["name"] == "slicetrace_counters"


# ---- ChromePlugin.finalize ----

class FullDisk:
    """A file whose writes fail as on a full disk; close is passed to the real file."""

    def __init__(self, f):
        self.f, self.closed = f, False

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self):
        self.closed = True
        self.f.close()


def test_a_failed_write_in_finalize_still_closes_the_file(tmp_path):
    p = ChromePlugin(Settings(profile_dump_file=str(tmp_path / "t")))
    ctx = p.init(COMM, abi.ActivationMask())
    parent = p.start_event(ctx, abi.CollDescr(abi.EventType.COLL, ts_ns=1))
    p.stop_event(parent, 400)
    ctx.file = full = FullDisk(ctx.file)
    with pytest.raises(OSError):
        p.finalize(ctx)
    assert full.closed and full.f.closed and ctx.done
    p.finalize(ctx)                                     # done: not retried
