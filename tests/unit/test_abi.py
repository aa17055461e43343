"""events.abi: NCCL's bit and state values, version tables, parent auto-inclusion, record dtype."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slicetrace.errors import PluginError
from slicetrace.events import abi
from slicetrace.events.abi import EventType as T
from slicetrace.events.abi import State


def test_event_bits_keep_nccl_values_and_kernel_step_takes_1_shl_16():
    expect = {"GROUP": 1, "COLL": 2, "P2P": 4, "PROXY_OP": 8, "PROXY_STEP": 16, "PROXY_CTRL": 32, "KERNEL_CH": 64,
              "NET_PLUGIN": 128, "GROUP_API": 256, "COLL_API": 512, "P2P_API": 1024, "KERNEL_LAUNCH": 2048,
              "CE_COLL": 4096, "CE_SYNC": 8192, "CE_BATCH": 16384, "KERNEL_PHASE": 1 << 15, "KERNEL_STEP": 1 << 16}
    assert {t.name: int(t) for t in T} == expect
    assert int(T.COLL | T.P2P | T.KERNEL_STEP) == 65542
    assert int(T.COLL | T.P2P | T.KERNEL_CH | T.KERNEL_STEP) == 65606


def test_states_keep_nccl_values():
    assert State.KERNEL_CH_STOP == 22 and State.GROUP_START_API_STOP == 23 and State.CE_BATCH_COMPLETE == 30
    assert State.KERNEL_PHASE_STOP == 31 and State.KERNEL_STEP_STOP == 32
    assert State.PROXY_CTRL_IDLE == 13 and State.PROXY_CTRL_APPEND_END == 18
    assert sorted(int(s) for s in State) == list(range(33))


def test_version_tables_are_cumulative_and_add_what_each_version_introduced():
    added = {3: T.KERNEL_CH | T.NET_PLUGIN, 5: T.GROUP_API | T.COLL_API | T.P2P_API | T.KERNEL_LAUNCH,
             6: T.CE_COLL | T.CE_SYNC | T.CE_BATCH, 7: T.KERNEL_PHASE, 8: T.KERNEL_STEP}
    for v in range(2, 9):
        assert abi.VERSION_TYPES[v] & abi.VERSION_TYPES[v - 1] == abi.VERSION_TYPES[v - 1]
        assert abi.VERSION_TYPES[v] & ~abi.VERSION_TYPES[v - 1] == added.get(v, 0)
    assert abi.ALL_TYPES == sum(int(t) for t in T)
    assert State.KERNEL_STEP_STOP in abi.VERSION_STATES[8] and State.KERNEL_STEP_STOP not in abi.VERSION_STATES[7]
    assert State.KERNEL_PHASE_STOP in abi.VERSION_STATES[7] and State.KERNEL_PHASE_STOP not in abi.VERSION_STATES[6]
    assert State.KERNEL_CH_STOP in abi.VERSION_STATES[4] and State.KERNEL_CH_STOP not in abi.VERSION_STATES[3]
    # NCCL's v1..v3 adapters forward only ProxyStep and ProxyCtrl states
    assert abi.VERSION_STATES[1] == abi.VERSION_STATES[2] == abi.VERSION_STATES[3]
    assert not {State(v) for v in range(8)} & abi.VERSION_STATES[8]


@pytest.mark.parametrize("child, parents", [
    (T.KERNEL_STEP, T.COLL | T.P2P | T.GROUP | T.COLL_API | T.P2P_API | T.GROUP_API),
    (T.KERNEL_CH, T.COLL | T.P2P | T.GROUP | T.COLL_API | T.P2P_API | T.GROUP_API),
    (T.COLL, T.GROUP | T.COLL_API | T.GROUP_API),
    (T.KERNEL_LAUNCH, T.GROUP_API),
    (T.KERNEL_PHASE, T.KERNEL_CH | T.COLL | T.P2P | T.GROUP | T.COLL_API | T.P2P_API | T.GROUP_API),
    (T.PROXY_CTRL, 0),
])
def test_effective_mask_adds_exactly_the_parents(child, parents):
    assert abi.effective_mask(int(child)) == int(child) | int(parents)


@settings(deadline=None)                # a loaded host can hold one example past the 200 ms default
@given(st.integers(0, int(abi.ALL_TYPES)))
def test_effective_mask_is_a_closure(mask):
    e = abi.effective_mask(mask)
    assert e & mask == mask                       # extensive
    assert abi.effective_mask(e) == e             # idempotent
    assert e & ~int(abi.ALL_TYPES) == 0


def test_check_version_names_plugin_value_and_accepted():
    assert abi.check_version(8) == 8
    with pytest.raises(PluginError, match=r"^profiler plugin 'm:P' has version=9; accepted: an int in "
                                          r"\[1, 2, 3, 4, 5, 6, 7, 8\] \(8 = v7 \+ KernelStep\)$"):
        abi.check_version(9, "'m:P'")
    with pytest.raises(PluginError, match=r"^profiler plugin has version=True; accepted: an int in"):
        abi.check_version(True)


def test_descriptors_carry_host_timestamps_and_records_have_three_clocks():
    for cls in (abi.CollDescr, abi.P2pDescr, abi.KernelChDescr, abi.KernelStepDescr, abi.GroupApiDescr):
        assert "ts_ns" in {f.name for f in dataclasses.fields(cls)}
    assert "ts_ns" in {f.name for f in dataclasses.fields(abi.StateArgs)}
    names = abi.KERNEL_STEP_DTYPE.names
    assert names[:5] == ("channel", "is_send", "peer", "step", "size")
    assert {"wait_clk", "ready_clk", "done_clk", "wait_ns", "ready_ns", "done_ns"} <= set(names)
