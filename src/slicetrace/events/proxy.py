"""The event host's ProxyCtrl events (EventHost, host.py): the drain's state changes in NCCL's shapes.

Mixed into EventHost, whose lock, slots, per-plugin ProxyCtrl handles and start/state/stop calls these use.
"""
from __future__ import annotations

import time
from typing import Any

from .abi import EventType, ProxyCtrlDescr, State, StateArgs
from .emit import _B
from .ops import OFF as _OFF, _Slot

_PC = _B.PROXY_CTRL
_CTRL_OPEN = {State.PROXY_CTRL_SLEEP, State.PROXY_CTRL_APPEND}          # each starts a ProxyCtrl event of its own,
_CTRL_SHUT = {State.PROXY_CTRL_WAKEUP, State.PROXY_CTRL_APPEND_END}     # which these end (as NCCL's proxy thread)


class ProxyCtrls:
    """Mixed into EventHost: expects its _lock, _closed, _slots, _proxy (per plugin: its Idle/Active event, its
    Sleep/Append one), comm, _pmask, _start, _state and _stop."""
    _slots: list[_Slot]
    _proxy: list[list[Any]]

    def proxy_ctrl_on(self) -> bool:
        """Some plugin's live mask has ProxyCtrl (NCCL rereads it per ProxyCtrl event): the drain's one check per
        state change (stamps/ctrl.py)."""
        return any(self._pmask(s) & _PC for s in self._slots)

    def proxy_ctrl(self, state: State, ts_ns: int | None = None, appended: int = 0) -> None:
        """A drain state change in NCCL's shapes, for plugins whose live mask has ProxyCtrl: Idle/Active are states
        of one event per plugin, stopped at close; Sleep and Append start an event each, which Wakeup and AppendEnd
        (appended_proxy_ops = `appended`) stop. An end whose start a plugin did not get is not shown to it."""
        ts = time.monotonic_ns() if ts_ns is None else ts_ns
        state, args = State(state), StateArgs(appended_proxy_ops=appended, ts_ns=ts)
        with self._lock:
            if self._closed:
                return
            for i, s in enumerate(self._slots):
                evs = self._proxy[i]
                if state in _CTRL_SHUT:
                    h, evs[1] = evs[1], _OFF
                    self._state(i, h, state, args)
                    self._stop(i, h, ts)
                    continue
                if not self._pmask(s) & _PC:
                    continue
                k = 1 if state in _CTRL_OPEN else 0
                if k or evs[0] is _OFF:
                    self._stop(i, evs[k], ts)      # a Sleep/Append whose end never came (else _OFF: a no-op)
                    evs[k] = self._start(i, ProxyCtrlDescr(EventType.PROXY_CTRL, None, self.comm.rank, ts), _OFF)
                self._state(i, evs[k], state, args)
