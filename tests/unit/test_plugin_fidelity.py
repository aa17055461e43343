"""events.plugin against NCCL's adapters (src/plugin/profiler/profiler_v*.cc, NCCL 2.31): what each version's adapter
does with the activation mask, what its init is given, which descriptor fields and state args reach it, and what
counts as a version. Each test failed before the fix it names."""
from __future__ import annotations

import numpy as np
import pytest

from slicetrace.errors import PluginError
from slicetrace.events import abi
from slicetrace.events.abi import EventType as T
from slicetrace.events.abi import State
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
from tests.unit.test_host import coll_op, p2p_op
from tests.unit.test_plugin import RecPlugin

COMM = abi.CommInfo(0xABC, "fid", 1, 4, 2)
CE = int(T.CE_COLL | T.CE_SYNC | T.CE_BATCH)
UNDEFINED = (1 << 17) | (1 << 24) | (1 << 31)        # no event type has these bits
EVERYTHING = int(abi.ALL_TYPES) | UNDEFINED


class InitRec(RecPlugin):
    """Records what its init was handed."""

    def init(self, comm, mask):
        self.got_comm = comm
        self.mask_obj = mask
        mask.value = self.want
        return "ctx"


# What NCCL's adapters leave in the plugin's own mask after init: v1..v4 leave it alone, v5 clears CE and (2.31)
# KernelPhase, v6 KernelPhase, v7 is passed through. PR #2316 adds KernelStep to every older version's list.
@pytest.mark.parametrize("version, cleared", [
    (1, T.KERNEL_STEP), (2, T.KERNEL_STEP), (3, T.KERNEL_STEP), (4, T.KERNEL_STEP),
    (5, T.KERNEL_STEP | T.KERNEL_PHASE | T.CE_COLL | T.CE_SYNC | T.CE_BATCH),
    (6, T.KERNEL_STEP | T.KERNEL_PHASE), (7, T.KERNEL_STEP), (8, 0)])
def test_init_clears_what_nccls_adapter_clears_and_the_host_reads_only_known_types(version, cleared):
    """Before, every old version's mask was cut to its known types (v1..v4 keep the rest in NCCL) and bits no type
    has were cleared even for the native version (NCCL's v7 core leaves them)."""
    p = InitRec(version=version, mask=EVERYTHING)
    lp = LoadedPlugin(p)
    lp.init(COMM, 0)
    assert p.mask_obj.value == EVERYTHING & ~int(cleared)
    assert lp.mask == int(abi.VERSION_TYPES[version])


@pytest.mark.parametrize("version", [3, 5, 8])
def test_the_mask_is_cleared_once_at_init_not_on_every_read(version):
    """NCCL's adapters clear after init only; a bit the plugin sets later stays in its mask (the host ignores it).
    Before, each read cleared it again."""
    p = InitRec(version=version, mask=int(T.COLL))
    lp = LoadedPlugin(p)
    lp.init(COMM, 0)
    p.mask_obj.value = int(T.COLL | T.KERNEL_STEP) | CE | UNDEFINED
    assert lp.mask == int(T.COLL) | (CE if version == 8 else 0) | (int(T.KERNEL_STEP) if version == 8 else 0)
    assert p.mask_obj.value == int(T.COLL | T.KERNEL_STEP) | CE | UNDEFINED


@pytest.mark.parametrize("version, asked", [(4, T.KERNEL_PHASE | T.GROUP_API | T.CE_COLL), (3, T.COLL_API),
                                            (8, 0), (2, T.KERNEL_CH)])
def test_bits_a_plugin_keeps_but_its_version_lacks_turn_nothing_on(version, asked):
    """A v4 plugin keeps KernelPhase, GroupApi and CE bits as in NCCL; they must not add parents it knows (KernelPhase
    would add KernelCh, Coll, Group) nor events of any type. Undefined bits turn nothing on either."""
    p = InitRec(version=version, mask=int(asked) | UNDEFINED)
    h = EventHost([LoadedPlugin(p)], COMM)
    assert h.op_mask() == 0
    h.begin_op(coll_op())
    h.begin_op(p2p_op(2))
    h.close()
    assert p.starts() == []


@pytest.mark.parametrize("version", range(1, 9))
def test_init_gets_the_communicator_from_v4_on(version):
    """NCCL's v1..v3 init is init(context, mask): no communicator (they read rank from the descriptors); v4 added
    commName, commHash, nNodes, nranks and rank. Before, every version got the CommInfo."""
    p = InitRec(version=version, mask=int(T.COLL | T.P2P))
    h = EventHost([LoadedPlugin(p)], COMM)
    assert p.got_comm is (COMM if version >= 4 else None)
    h.begin_op(coll_op())
    h.begin_op(p2p_op(2))
    h.close()
    descrs = p.starts(T.COLL) + p.starts(T.P2P)
    assert len(descrs) == 3 and {d.rank for d in descrs} == {COMM.rank}
    # v4+ take commHash at init; NCCL's v1..v3 adapters set the descriptors' commHash to 0 ("removed in v4"):
    # only the native descriptor carries it
    assert {d.comm_hash for d in descrs} == {COMM.comm_hash if version == 8 else 0}


@pytest.mark.parametrize("version, trans", [(1, 0), (3, 0), (4, 4096), (7, 4096), (8, 4096)])
def test_v1_to_v3_state_args_carry_only_the_proxy_ctrl_count(version, trans):
    """NCCL's v1..v3 adapters hand zeroed args but ProxyCtrl's appendedProxyOps (ProxyStep states get no
    transSize); v4+ get the state's field. Before, v1..v3 were handed every field."""
    p = InitRec(version=version, mask=0)
    lp = LoadedPlugin(p)
    lp.init(COMM, 0)
    lp.record_event_state("h", State.PROXY_STEP_SEND_WAIT, abi.StateArgs(trans_size=4096, p_timer=9, ts_ns=5))
    lp.record_event_state("h", State.PROXY_CTRL_APPEND_END, abi.StateArgs(appended_proxy_ops=3, data="x", ts_ns=6))
    (_, _, s1, step), (_, _, s2, ctrl) = p.of("state")
    assert (s1, step.trans_size, step.ts_ns) == (State.PROXY_STEP_SEND_WAIT, trans, 5)
    assert (s2, ctrl.appended_proxy_ops, ctrl.ts_ns) == (State.PROXY_CTRL_APPEND_END, 3, 6)
    if version <= 3:
        assert (step.p_timer, ctrl.data) == (0, None)


@pytest.mark.parametrize("bad", [True, False, 5.0, "5", None, 9, 0, -1])
def test_a_version_that_is_not_an_int_in_1_to_8_is_refused_with_the_value_named(bad):
    """version=True passed as version 1 and 5.0 as 5 (both equal dict keys); a bool or a float is no version."""
    with pytest.raises(PluginError, match=rf"^profiler plugin 'p' has version={bad!r}; accepted: an int in "
                                          r"\[1, 2, 3, 4, 5, 6, 7, 8\] \(8 = v7 \+ KernelStep\)$"):
        LoadedPlugin(RecPlugin(version=bad), "p")


def test_a_numpy_integer_version_counts_as_that_int():
    lp = LoadedPlugin(RecPlugin(version=np.int64(5)), "p")
    assert lp.version == 5 and type(lp.version) is int and lp.known_types == int(abi.VERSION_TYPES[5])
