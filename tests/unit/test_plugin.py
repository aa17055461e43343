"""events.plugin: version adapters (mask stripping, events and states per version), slow path, loading."""
from __future__ import annotations

import importlib
import sys
import textwrap

import numpy as np
import pytest

from slicetrace.config import Settings
from slicetrace.errors import PluginError
from slicetrace.events import abi, loading, plugin
from slicetrace.events.abi import EventType as T
from slicetrace.events.abi import State
from slicetrace.events.loading import load_plugins
from slicetrace.events.plugin import LoadedPlugin
from tests.helpers.plugins import NoopPlugin

COMM = abi.CommInfo(0xABC, "test", 1, 4, 2)


class RecPlugin:
    """Records every call; handles are ("h", n). `none_for` = types whose start returns None."""

    def __init__(self, version: int = 8, mask: int = int(abi.ALL_TYPES), batch: bool = True, name: str = "rec",
                 none_for: int = 0, raise_in: str = "", keep: int | None = None):
        self.version, self.name, self.want, self.none_for = version, name, mask, none_for
        self.calls: list[tuple] = []
        self.raise_in, self.keep, self.n, self.mask_obj = raise_in, keep, 0, None
        if batch:
            self.kernel_step_batch = self._batch

    def _maybe_raise(self, what: str) -> None:
        if self.raise_in == what:
            raise RuntimeError(f"boom in {what}")

    def init(self, comm, mask):
        self._maybe_raise("init")
        self.mask_obj = mask
        mask.value = self.want
        return ("ctx", None if comm is None else comm.rank)        # versions 1..3 get no comm, as in NCCL

    def start_event(self, ctx, descr):
        self._maybe_raise("start_event")
        self.calls.append(("start", descr))
        if int(descr.type) & self.none_for:
            return None
        self.n += 1
        return ("h", self.n, descr.type)

    def stop_event(self, handle, ts_ns):
        self._maybe_raise("stop_event")
        self.calls.append(("stop", handle, ts_ns))

    def record_event_state(self, handle, state, args):
        self.calls.append(("state", handle, State(state), args))

    def _batch(self, ctx, parent, recs):
        self._maybe_raise("kernel_step_batch")
        self.calls.append(("batch", parent, recs.copy()))
        return len(recs) if self.keep is None else min(self.keep, len(recs))

    def report_counters(self, ctx, counters):
        self.calls.append(("counters", dict(counters)))

    def finalize(self, ctx):
        self.calls.append(("finalize", ctx))

    def starts(self, etype=None):
        return [c[1] for c in self.calls if c[0] == "start" and (etype is None or c[1].type == etype)]

    def of(self, kind):
        return [c for c in self.calls if c[0] == kind]


def _loaded(version, **kw):
    p = RecPlugin(version, **kw)
    lp = LoadedPlugin(p)
    lp.init(COMM, 0)
    return p, lp


def _descr(etype):
    cls = {T.GROUP: abi.GroupDescr, T.COLL: abi.CollDescr, T.P2P: abi.P2pDescr, T.KERNEL_CH: abi.KernelChDescr,
           T.GROUP_API: abi.GroupApiDescr, T.COLL_API: abi.CollApiDescr, T.P2P_API: abi.P2pApiDescr,
           T.KERNEL_LAUNCH: abi.KernelLaunchDescr, T.KERNEL_STEP: abi.KernelStepDescr,
           T.PROXY_CTRL: abi.ProxyCtrlDescr}.get(etype, abi.Descriptor)
    return cls(etype)


@pytest.mark.parametrize("version", range(1, 9))
def test_the_host_reads_only_known_bits_and_init_clears_kernel_step_below_v8(version):
    p, lp = _loaded(version)
    known = int(abi.VERSION_TYPES[version])
    assert lp.mask == known and p.mask_obj.value & int(T.KERNEL_STEP) == (version == 8) * int(T.KERNEL_STEP)
    p.mask_obj.value = int(abi.ALL_TYPES)        # the plugin sets everything again later: left, not acted on
    assert lp.mask == known and p.mask_obj.value == int(abi.ALL_TYPES)


@pytest.mark.parametrize("version", range(1, 9))
def test_each_version_sees_only_the_event_types_it_knows(version):
    p, lp = _loaded(version)
    for etype in T:
        h = lp.start_event(_descr(etype))
        known = bool(abi.VERSION_TYPES[version] & etype)
        assert (h is not None) == known, (version, etype)
    assert {d.type for d in p.starts()} == {t for t in T if abi.VERSION_TYPES[version] & t}
    assert lp.knows(T.KERNEL_STEP) == (version == 8) and lp.knows(T.KERNEL_PHASE) == (version >= 7)


@pytest.mark.parametrize("version", range(1, 9))
def test_each_version_sees_only_the_states_it_knows(version):
    p, lp = _loaded(version)
    for s in State:
        lp.record_event_state(("h", 1), s, abi.StateArgs())
    assert {c[2] for c in p.of("state")} == set(abi.VERSION_STATES[version])


def test_v7_never_sees_kernel_step_and_v6_never_sees_kernel_phase():
    p7, lp7 = _loaded(7)
    assert lp7.start_event(_descr(T.KERNEL_STEP)) is None and not lp7.has_batch
    lp7.record_event_state(("h",), State.KERNEL_STEP_STOP, abi.StateArgs())
    assert lp7.kernel_step_batch(("h",), np.zeros(3, abi.KERNEL_STEP_DTYPE)) == 0
    assert p7.calls == []
    p6, lp6 = _loaded(6)
    assert lp6.start_event(_descr(T.KERNEL_PHASE)) is None
    lp6.record_event_state(("h",), State.KERNEL_PHASE_STOP, abi.StateArgs())
    assert p6.calls == []


@pytest.mark.parametrize("version, expect_parent", [(4, "group"), (3, "group"), (1, "group"), (5, "api"), (8, "api")])
def test_v4_and_older_see_coll_and_p2p_parented_by_parent_group(version, expect_parent):
    p, lp = _loaded(version)
    lp.start_event(abi.CollDescr(T.COLL, parent="api", parent_group="group"))
    lp.start_event(abi.P2pDescr(T.P2P, parent="api", parent_group="group"))
    assert [d.parent for d in p.starts()] == [expect_parent] * 2



@pytest.mark.parametrize("version", range(1, 9))
def test_coll_and_p2p_fields_a_version_lacks_are_not_passed_to_it(version):
    """parentGroup is v5's and p2p nChannels v4's (NCCL's v1..v4 descriptors lack them, its adapters copy neither):
    v1..v4 plugins were handed both, as user_tag and is_sym_coll are not below v7."""
    p, lp = _loaded(version)
    lp.start_event(abi.CollDescr(T.COLL, parent="api", parent_group="group", n_channels=3))
    lp.start_event(abi.P2pDescr(T.P2P, parent="api", parent_group="group", n_channels=2))
    coll, p2p = p.starts()
    assert (coll.parent_group, p2p.parent_group) == (("group", "group") if version >= 5 else (None, None))
    assert (coll.n_channels, p2p.n_channels) == (3, 2 if version >= 4 else 0)     # v1..v3 coll: nMaxChannels

def test_v3_kernel_ch_has_no_p_timer_but_v4_does():
    p3, lp3 = _loaded(3)
    p4, lp4 = _loaded(4)
    for lp in (lp3, lp4):
        lp.start_event(abi.KernelChDescr(T.KERNEL_CH, channel_id=5, p_timer=777))
    assert (p3.starts()[0].p_timer, p3.starts()[0].channel_id) == (0, 5)
    assert p4.starts()[0].p_timer == 777


def test_v1_sees_enum_codes_and_v2_strings():
    p1, lp1 = _loaded(1)
    p2, lp2 = _loaded(2)
    for lp in (lp1, lp2):
        lp.start_event(abi.CollDescr(T.COLL, func="AllReduce", datatype="ncclFloat32", algo="RING", proto="SIMPLE"))
        lp.start_event(abi.P2pDescr(T.P2P, func="Send", datatype="ncclBfloat16"))
    c1, s1 = p1.starts()
    assert (c1.func, c1.datatype, c1.algo, c1.proto) == (4, 7, 1, 2) and (s1.func, s1.datatype) == (6, 9)
    c2 = p2.starts()[0]
    assert (c2.func, c2.datatype, c2.algo, c2.proto) == ("AllReduce", "ncclFloat32", "RING", "SIMPLE")


def test_user_tag_reaches_v7_only():
    p6, lp6 = _loaded(6)
    p8, lp8 = _loaded(8)
    for lp in (lp6, lp8):
        lp.start_event(abi.CollDescr(T.COLL, user_tag=42, is_sym_coll=True))
    assert (p6.starts()[0].user_tag, p6.starts()[0].is_sym_coll) == (0, False)
    assert (p8.starts()[0].user_tag, p8.starts()[0].is_sym_coll) == (42, True)


def _ks_recs(n):
    r = np.zeros(n, abi.KERNEL_STEP_DTYPE)
    r["channel"], r["is_send"], r["peer"], r["step"], r["size"] = 3, [i % 2 for i in range(n)], 1, np.arange(n) * 2, 512
    r["wait_clk"], r["ready_clk"], r["done_clk"] = 100 + np.arange(n), 200 + np.arange(n), 300 + np.arange(n)
    r["wait_ns"], r["ready_ns"], r["done_ns"] = 1100 + np.arange(n), 1200 + np.arange(n), 1300 + np.arange(n)
    return r


def test_slow_path_is_start_state_stop_per_record():
    p, lp = _loaded(8, batch=False)
    assert not lp.has_batch
    assert lp.kernel_step_batch("parent", _ks_recs(3)) == 3
    kinds = [c[0] for c in p.calls]
    assert kinds == ["start", "state", "stop"] * 3
    d = p.calls[3][1]
    assert (d.type, d.parent, d.rank, d.channel_id, d.is_send, d.peer, d.step, d.size) == \
        (T.KERNEL_STEP, "parent", 2, 3, True, 1, 2, 512)
    assert (d.wait, d.ready, d.done, d.ts_ns) == (101, 201, 301, 1101)
    state = p.calls[4]
    assert state[2] == State.KERNEL_STEP_STOP and state[3].p_timer == 301 and state[3].ts_ns == 1301
    assert p.calls[5][2] == 1301


def test_slow_path_counts_only_records_the_plugin_kept():
    p, lp = _loaded(8, batch=False, none_for=int(T.KERNEL_STEP))
    assert lp.kernel_step_batch("parent", _ks_recs(4)) == 0
    assert [c[0] for c in p.calls] == ["start"] * 4


def test_batch_path_passes_records_through():
    p, lp = _loaded(8, keep=2)
    assert lp.has_batch and lp.kernel_step_batch("par", _ks_recs(5)) == 2
    (_, parent, recs), = p.of("batch")
    assert parent == "par" and len(recs) == 5


# ---- loading ----

def test_none_spec_loads_nothing():
    assert load_plugins(None, Settings()) == [] and load_plugins("", Settings()) == []
    assert load_plugins(" None ", Settings()) == []


def test_a_plugin_listed_twice_is_refused():
    """Two example plugins would write the same <prefix>_<commHash>_<rank>.json, one over the other."""
    with pytest.raises(PluginError, match=r"^profiler_plugin \(SLICETRACE_PROFILER_PLUGIN\)='example, linkstats,"
                                          r"example': 'example' is listed twice \(maybe by another name\); list each "
                                          r"plugin once$"):
        load_plugins("example, linkstats,example", Settings())


def test_builtin_example_is_the_chrome_plugin_built_with_settings():
    s = Settings(profile_event_mask=6)
    (lp,) = load_plugins("example", s)
    assert type(lp.plugin).__name__ == "ChromePlugin" and lp.version == 8 and lp.has_batch
    assert lp.plugin.mask_value == 6


@pytest.fixture
def plugmod(tmp_path, monkeypatch):
    (tmp_path / "st_fake_plugins.py").write_text(textwrap.dedent("""
        class P:
            version = 5
            name = "p"
            def __init__(self, settings=None): self.settings = settings
            def init(self, comm, mask): return None
            def start_event(self, ctx, d): return 1
            def stop_event(self, h, ts): pass
            def record_event_state(self, h, s, a): pass
            def finalize(self, ctx): pass
        INSTANCE = P("instance")
        def factory(settings): return P(settings)
        BAD = object()
        class Half:
            version = 8
            def init(self, comm, mask): return None
        HALF = Half()
        class OLD(P):
            version = 0
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "st_fake_plugins"
    sys.modules.pop("st_fake_plugins", None)


def test_module_attr_instances_factories_and_fan_out(plugmod):
    s = Settings()
    lps = load_plugins(f"{plugmod}:INSTANCE, {plugmod}:factory,{plugmod}:P", s)
    assert [lp.plugin.settings for lp in lps] == ["instance", s, s]
    assert [lp.source for lp in lps] == [f"{plugmod}:INSTANCE", f"{plugmod}:factory", f"{plugmod}:P"]


def test_entry_point_names_resolve(plugmod, monkeypatch):
    class EP:
        value = f"{plugmod}:P"

        def load(self):
            return importlib.import_module(plugmod).P
    monkeypatch.setattr(loading, "_entry_points", lambda: {"mine": EP()})
    (lp,) = load_plugins("mine", Settings())
    assert lp.version == 5


def test_unknown_name_names_the_value_and_what_is_accepted(monkeypatch):
    monkeypatch.setattr(loading, "_entry_points", lambda: {"mine": None})
    with pytest.raises(PluginError, match=r"^profiler_plugin \(SLICETRACE_PROFILER_PLUGIN\)='nope' \(item 2 of 2 in "
                                          r"'example,nope'\) is not a built-in or entry point name \(\['example', 'flightrec', 'inspector', 'linkstats', 'mine'\]\) nor a 'module:attr' path"):
        load_plugins("example,nope", Settings())


def test_bad_imports_versions_and_objects_are_plugin_errors(plugmod):
    with pytest.raises(PluginError, match=r"cannot import 'no_such_mod_x:P'"):
        load_plugins("no_such_mod_x:P", Settings())
    with pytest.raises(PluginError, match=r"resolved to <object .*>, which is neither a plugin"):
        load_plugins(f"{plugmod}:BAD", Settings())
    with pytest.raises(PluginError, match=r"'st_fake_plugins:HALF' has no callable start_event\(\)"):
        load_plugins(f"{plugmod}:HALF", Settings())
    with pytest.raises(PluginError, match=r"'st_fake_plugins:OLD' has version=0; accepted: an int in "
                                          r"\[1, 2, 3, 4, 5, 6, 7, 8\]"):
        load_plugins(f"{plugmod}:OLD", Settings())
    with pytest.raises(PluginError, match=r"'none' cannot be combined"):
        load_plugins("example,none", Settings())


def test_plugin_protocol_is_checkable():
    assert isinstance(RecPlugin(), plugin.Plugin)
    assert not isinstance(object(), plugin.Plugin)


class _NoArgs(NoopPlugin):
    name = "noargs"

    def __init__(self):
        self.made = True


class _Bare(NoopPlugin):
    __init__ = object.__init__


class _Fails(NoopPlugin):
    def __init__(self, settings):
        raise RuntimeError("no licence")


def test_a_plugin_class_is_made_with_settings_or_with_nothing_and_a_failure_is_a_plugin_error():
    """A class whose __init__ takes no argument made every rank fail with a bare TypeError (it was always called
    with settings); one that raises is named."""
    from slicetrace.errors import PluginError
    from slicetrace.events.loading import load_plugins
    for cls in ("_NoArgs", "_Bare"):
        (lp,) = load_plugins(f"tests.unit.test_plugin:{cls}", None)
        assert type(lp.plugin).__name__ == cls
    with pytest.raises(PluginError, match=r"profiler_plugin item 'tests.unit.test_plugin:_Fails': RuntimeError from "
                                          r"tests.unit.test_plugin:_Fails\(settings\): no licence"):
        load_plugins("tests.unit.test_plugin:_Fails", None)


class _KeywordOnly(NoopPlugin):
    def __init__(self, *, verbose=False):
        self.verbose = verbose


class _Options(NoopPlugin):
    def __init__(self, **opts):
        self.opts = opts


def test_a_constructor_that_cannot_take_settings_positionally_is_called_with_nothing():
    from slicetrace.events.loading import load_plugins
    for cls in ("_KeywordOnly", "_Options"):
        (lp,) = load_plugins(f"tests.unit.test_plugin:{cls}", "the settings")
        assert type(lp.plugin).__name__ == cls


def test_a_module_that_fails_to_import_or_a_malformed_path_is_a_plugin_error(tmp_path, monkeypatch):
    """Only ImportError and AttributeError were wrapped: a module raising at import, ':P' (ValueError) and '.rel:P'
    (TypeError) reached the user raw, without the item or the variable named."""
    (tmp_path / "st_raises_at_import.py").write_text("raise RuntimeError('needs a licence')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec, why in (("st_raises_at_import:P", "RuntimeError: needs a licence"), (":P", "ValueError: Empty module"),
                      (".rel:P", "TypeError: the 'package' argument is required")):
        with pytest.raises(PluginError, match=rf"^profiler_plugin item '{spec}': cannot import '{spec}' \({why}"):
            load_plugins(spec, Settings())
    sys.modules.pop("st_raises_at_import", None)
