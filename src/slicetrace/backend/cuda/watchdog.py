"""A thread per cuda communicator that aborts an op which can no longer finish, also when nobody waits on it
through the communicator: a user who synchronizes the stream or the device itself (torch.cuda.synchronize, a
`.get()`) would otherwise wait forever for a peer that died. It acts on evidence only (a peer's abort, a peer
gone), never on elapsed time: an op may legitimately queue behind long work on its stream."""
from __future__ import annotations

import logging
import threading
from typing import Any

from ...errors import MismatchError, PeerError

log = logging.getLogger("slicetrace")


class Watchdog:
    def __init__(self, backend: Any, period_s: float = 0.25):
        self.be, self.period_s = backend, period_s
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"slicetrace-watchdog-r{backend.rank}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        be = self.be
        try:
            be.thread_init()                # its event queries on our device, not a new context on GPU 0
        except Exception:  # noqa: BLE001 - no device: nothing to watch
            return
        while not self._stop.wait(self.period_s):
            if be.last_token is None or be.broken is not None:
                continue
            try:
                tok, behind = be.running_token()     # the op on the GPU now: a failure is its, not the last's
                why, kind = be.mismatch(), MismatchError      # also after the op ended: a peer said later
                if why is None:             # also after it ended: on an abort word, later ops must be refused
                    why, kind = be.cannot_finish(tok), PeerError
                if why is not None and not self._stop.is_set():   # stopped: the backend may be freeing
                    why += behind
                    log.warning("slicetrace: rank %d: aborting op %d: %s", be.rank, tok.tag, why)
                    be.abort(why, kind, tok.op)     # tok's: what later ops' errors are credited to
            except Exception:  # noqa: BLE001 - a store gone at shutdown: the waiting caller reports it
                continue

    def stop(self) -> None:
        self._stop.set()
        if self.thread is not threading.current_thread():
            self.thread.join(2.0)
