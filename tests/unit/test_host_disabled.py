"""A disabled plugin's losses: every event it would have got once its failures disabled it is counted
`plugin_disabled`. Before, its mask left the ops' snapshots, so the ops after it were neither offered to it nor
counted anywhere (a user's plugin missed 36 of 40 ops with plugin_disabled 0)."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from slicetrace.events import abi
from slicetrace.events.abi import EventType as T
from slicetrace.events.abi import State
from tests.unit.test_host import CH, KS, chrec, coll_op, host_of, p2p_op, recs
from tests.unit.test_plugin import RecPlugin

# KernelLaunch and ProxyCtrl too: every kind of event the host emits, and the parents KernelStep adds
MASK = KS | CH | int(T.KERNEL_LAUNCH) | int(T.PROXY_CTRL)
N_OPS = 6


@pytest.fixture(autouse=True)
def _quiet(caplog):
    caplog.set_level(logging.CRITICAL, logger="slicetrace")      # the disabling is logged, tested in test_host


def _run(plugin) -> tuple:
    """N_OPS ops, collectives (two channels) and p2p groups (a send and a receive) in turn, each with its
    KernelSteps, KernelCh records and a drain Append; the host and its counters after close."""
    h = host_of(plugin, max_failures=1)
    h.proxy_ctrl(State.PROXY_CTRL_ACTIVE)
    for tag in range(1, N_OPS + 1):
        if tag % 2:
            h.begin_op(coll_op(tag, n_programs=2))
            h.steps(tag, recs(tag, 4))
            h.channel(tag, np.concatenate([chrec(tag, 0), chrec(tag, 1)]))
        else:
            h.begin_op(p2p_op(tag))
            h.steps(tag, np.concatenate([recs(tag, 3, send=1, peer=2), recs(tag, 2, send=0, peer=0)]))
            h.channel(tag, np.concatenate([chrec(tag, send=1, peer=2), chrec(tag, send=0, peer=0)]))
        h.proxy_ctrl(State.PROXY_CTRL_APPEND, appended=1)
        h.proxy_ctrl(State.PROXY_CTRL_APPEND_END)
    h.close()
    return h, h.counters()


def test_a_disabled_plugin_counts_every_event_a_healthy_one_got():
    _, good = _run(RecPlugin(mask=MASK, name="good"))
    bad_plugin = RecPlugin(mask=MASK, name="bad", raise_in="start_event")     # its first start disables it
    h, bad = _run(bad_plugin)
    assert h.disabled() == ["bad"] and bad_plugin.starts() == []
    delivered = {k: v for k, v in good.items() if k.startswith("delivered_")}
    assert set(delivered) >= {"delivered_kernel_step", "delivered_kernel_ch", "delivered_coll", "delivered_p2p",
                              "delivered_kernel_launch", "delivered_proxy_ctrl"}, delivered
    assert not any(k.startswith("delivered_") and v for k, v in bad.items()), bad
    # what the healthy twin got, the disabled one lost, each event counted once: its one failure (the drain's
    # first ProxyCtrl) and every later event
    assert bad["plugin_error"] == 1
    assert bad["plugin_error"] + bad["parent_dropped"] + bad["plugin_disabled"] == sum(delivered.values())
    assert bad["masked_out"] == good["masked_out"] and bad["missing_kernel_ch"] == good["missing_kernel_ch"] == 0


def test_a_disabled_plugin_keeps_its_mask_in_the_op_snapshot():
    """So that the records of its ops are still made, and each one it misses is counted, even when it is the only
    plugin (an op mask of 0 would run the op unprofiled, its losses uncounted)."""
    h = host_of(RecPlugin(mask=KS, raise_in="start_event"), max_failures=1)
    h.begin_op(coll_op(1))
    assert h.disabled() and h.op_mask() == abi.effective_mask(KS)
    h.begin_op(coll_op(2))
    h.steps(2, recs(2, 5))
    h.channel(2, chrec(2))
    c = h.counters()
    # op 2: GroupApi, CollApi, Group, Coll and 5 KernelSteps (KernelCh: not in its mask, masked_out)
    assert c["plugin_disabled"] - 3 == 4 + 5 and c["masked_out"] == 1, c      # op 1: 3 of its starts after the one
