"""stamps.pairing: KernelCh start/stop records paired into one, within a poll and across polls."""
from __future__ import annotations

from collections import Counter

import numpy as np

from slicetrace.stamps.layout import FLAG_CH_STOP, KIND_CHANNEL, PAIRED_DTYPE
from slicetrace.stamps.pairing import pair_channels


def _ch(rows):
    """KernelCh records (stop, clock), all of one key: channel 0, op 1, peer 1, recv."""
    out = np.zeros(len(rows), PAIRED_DTYPE)
    out["channel"], out["op"], out["peer"], out["kind"] = 0, 1, 1, KIND_CHANNEL
    for i, (stop, clk) in enumerate(rows):
        out[i]["flags"] = FLAG_CH_STOP if stop else 0
        out[i]["wait"] = out[i]["ready"] = out[i]["done"] = clk
    return out


def test_a_start_superseded_in_its_poll_is_not_kept_open_for_a_later_stop():
    """Two starts of one key in a poll, the first without its stop: the second pairs with the stop, and nothing
    stays open, so a stray stop in a later poll is unpaired rather than given the first start's clock. The first
    start is counted unpaired (it vanished uncounted before), as the stray stop is."""
    open_, drops = {}, Counter()
    drop = lambda reason, n: drops.update({reason: n})          # noqa: E731
    out = _ch([(False, 10), (False, 20), (True, 30)])
    keep = pair_channels(out, np.ones(3, bool), open_, drop)
    assert keep.tolist() == [False, False, True] and open_ == {}
    assert (int(out[2]["wait"]), int(out[2]["ready"]), int(out[2]["done"])) == (20, 20, 30)
    stray = _ch([(True, 40)])
    assert pair_channels(stray, np.ones(1, bool), open_, drop).tolist() == [False]
    assert drops == Counter({"unpaired": 2}) and open_ == {}


def test_a_start_left_open_by_an_earlier_poll_and_superseded_is_counted():
    open_, drops = {(0, 1, 1, 0): 5}, Counter()
    drop = lambda reason, n: drops.update({reason: n})          # noqa: E731
    pair_channels(_ch([(False, 10)]), np.ones(1, bool), open_, drop)
    assert open_ == {(0, 1, 1, 0): 10} and drops == Counter({"unpaired": 1})


def test_a_start_whose_stop_comes_in_a_later_poll_waits_in_open():
    open_, drops = {}, Counter()
    drop = lambda reason, n: drops.update({reason: n})          # noqa: E731
    keep = pair_channels(_ch([(False, 10)]), np.ones(1, bool), open_, drop)
    assert keep.tolist() == [False] and open_ == {(0, 1, 1, 0): 10}
    out = _ch([(True, 50)])
    assert pair_channels(out, np.ones(1, bool), open_, drop).tolist() == [True]
    assert (int(out[0]["ready"]), int(out[0]["done"])) == (10, 50) and open_ == {} and not drops
