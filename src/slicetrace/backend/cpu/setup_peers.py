"""The cpu backend's set-up as its peers see it: a rank whose set-up failed says why in the store, and one waiting
for its peers finds one that failed, or died before or after it published its segment, at once (not at
timeout_s), and removes a dead one's segment name (outside launch() no one else will)."""
from __future__ import annotations

from ...errors import PeerError
from ..procs import proc_dead, proc_gone
from ..segment import unlink_name
from .shm import C_CLOSED


class SetupPeers:
    """Mixed into CpuBackend: uses its store, _prefix, rank, world, guard, _making and _names."""

    def _say_failed(self, e: BaseException) -> None:
        try:
            self.store.set(f"{self._prefix}/failed/{self.rank}", f"{type(e).__name__}: {e}".encode())
        except Exception:  # noqa: BLE001 - the store may be what failed
            pass

    def _peers_alive(self) -> None:
        """Set-up waits: an attached peer that died or failed, or one that failed before it published its segment,
        ends the wait now, not at timeout_s. One whose set-up failed says why (it is closed, and set its key
        first: this finds the key before check_peers confirms 'closed its communicator' at a second look)."""
        self.check_peers()
        for p in range(self.world):
            peer = self.guard.peers.get(p)
            if p != self.rank and (peer is None or peer[0][C_CLOSED]):
                why = self.store.try_get(f"{self._prefix}/failed/{p}")
                if why is not None:
                    raise PeerError(f"rank {p} failed to set up its cpu backend: {why.decode(errors='replace')}; "
                                    f"detected by rank {self.rank}")
                dead = self._died_making(p) if peer is None else None
                if dead:
                    raise PeerError(f"rank {p} {dead} during its cpu backend set-up; detected by rank {self.rank}")

    def _died_making(self, p: int) -> str | None:
        """'(pid N) exited' for a peer killed in its set-up before we attached it; its name is then removed (if it
        was killed before publishing it, no one else can)."""
        raw = self._making[p] = self._making.get(p) or self.store.try_get(f"{self._prefix}/making/{p}")
        name, info = raw.decode().split(" ", 1) if raw else ("", "")
        why = proc_gone(info) if info else None
        if why is None:
            return None
        unlink_name(name)
        return f"(pid {info.split(' ', 1)[0]}) {why}"

    def _unlink_dead_peers(self) -> None:
        """Set-up failed: remove the names of attached peers that died (no one else will outside launch());
        one that is alive or closed removes its own."""
        g = getattr(self, "guard", None)
        for p, (pctl, _, pid, start) in list(g.peers.items()) if g is not None else ():
            if not pctl[C_CLOSED] and pid and proc_dead(pid, start):
                unlink_name(self._names[p])
