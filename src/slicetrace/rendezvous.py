"""Key/value stores for rendezvous. Not a home-made protocol: a multiprocessing Manager dict (slicetrace.launch)
or torch.distributed's TCPStore (torchrun). Values are bytes; every get has a timeout."""
from __future__ import annotations

import abc
import atexit
import threading
import time
from typing import Any, Callable

from .errors import CommTimeoutError, PeerError, SliceTraceError

CHECK_AFTER_S = 0.01        # a wait this long starts asking `check` whether to give up (then every CHECK_EVERY_S)
CHECK_EVERY_S = 0.05


# connect threads left inside torch's C++ past our wait: one that returns into a finalizing interpreter aborts the
# process ('terminate called without an active exception', SIGABRT), so exit waits for them, bounded
_CONNECTING: list[tuple[threading.Thread, float]] = []


def _join_connecting() -> None:
    for t, bound in _CONNECTING:
        t.join(bound)


class Store(abc.ABC):
    @abc.abstractmethod
    def set(self, key: str, value: bytes) -> None: ...

    @abc.abstractmethod
    def try_get(self, key: str) -> bytes | None: ...

    def get(self, key: str, timeout_s: float, what: str = "", check: Callable[[], None] | None = None) -> bytes:
        """The key's value once it is set. check(): raises (a SliceTraceError) when waiting is pointless, e.g. the
        communicator was aborted or a peer died; a key set just before its setter went away is still returned."""
        now = time.monotonic()
        deadline, check_at = now + timeout_s, now + CHECK_AFTER_S
        delay = 1e-4
        while True:
            v = self.try_get(key)
            if v is not None:
                return v
            now = time.monotonic()
            if check is not None and now >= check_at:
                check_at = now + CHECK_EVERY_S
                try:
                    check()
                except SliceTraceError:
                    v = self.try_get(key)       # a peer may set it, leave and close between our two reads
                    if v is not None:
                        return v
                    raise
            if now > deadline:
                raise CommTimeoutError(f"rendezvous: {what or key!r} did not arrive within timeout_s={timeout_s}")
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def claim(self, key: str, value: bytes) -> bytes:
        """Set key to value unless it is set; the value it holds after (ours, or the first claimant's). Atomic in
        the stores below; this fallback is not (a race of two claimants can leave the second's value)."""
        v = self.try_get(key)
        if v is None:
            self.set(key, value)
            v = self.try_get(key)
        return value if v is None else v

    def delete(self, key: str) -> None:
        """Forget a key nobody will read again (long runs would otherwise grow the store without end)."""

    def barrier(self, name: str, rank: int, world: int, timeout_s: float,
                check: Callable[[], None] | None = None) -> None:
        self.set(f"{name}/{rank}", b"1")
        for r in range(world):
            self.get(f"{name}/{r}", timeout_s, what=f"rank {r} at barrier {name!r}", check=check)


class DictStore(Store):
    """Over a dict-like object: a multiprocessing.Manager().dict() proxy shared by spawned ranks, or a plain dict."""

    def __init__(self, mapping: Any):
        self._d = mapping

    def set(self, key: str, value: bytes) -> None:
        self._call("set", key, self._d.__setitem__, key, value)

    def try_get(self, key: str) -> bytes | None:
        return self._call("get", key, self._d.get, key)

    def claim(self, key: str, value: bytes) -> bytes:
        return self._call("set", key, self._d.setdefault, key, value)   # one call: atomic in a Manager's dict

    def delete(self, key: str) -> None:
        self._call("delete", key, self._d.pop, key, None)

    @staticmethod
    def _call(verb: str, key: str, fn: Callable, *args: Any) -> Any:
        try:
            return fn(*args)
        except (OSError, EOFError) as e:    # a Manager's server gone (a plain dict raises neither): not the
            raise PeerError(                # manager's 30-line traceback ending in ConnectionRefusedError
                f"rendezvous store: could not {verb} {key!r}: its server process (a multiprocessing Manager: "
                f"launch()'s, which ends with its launcher, or the one given to DictStore) is gone "
                f"({type(e).__name__}: {e})") from None


class LaunchStore(DictStore):
    """launch()'s store in its ranks: a wait in it (a later init()'s set-up, a barrier) also ends, in PeerError,
    once another rank of the launch failed (FAILED_KEY, set by that rank or the launcher), not at timeout_s: the
    ranks of a communicator not yet made cannot watch each other."""
    FAILED_KEY = "slicetrace/launch/failed"

    def get(self, key: str, timeout_s: float, what: str = "", check: Callable[[], None] | None = None) -> bytes:
        def failed() -> None:
            why = self.try_get(self.FAILED_KEY)
            if why is not None:
                raise PeerError(f"{why.decode()} (while this rank waited for {what or key!r})")
            if check is not None:
                check()
        return super().get(key, timeout_s, what, failed)


class TorchStore(Store):
    """torch.distributed.TCPStore (torchrun: MASTER_ADDR/MASTER_PORT), or a store torch already made. `where` names
    it in errors: torch's own are a C++ exception type and text that name neither the variables nor timeout_s."""

    def __init__(self, store: Any, where: str = "torch.distributed's store"):
        self._s = store
        self._where = where

    @classmethod
    def connect(cls, addr: str, port: int, rank: int, world: int, server: bool, timeout_s: float) -> "TorchStore":
        """A TCPStore at addr:port (server: host it, as rank 0 does outside torchrun), waited for timeout_s at most:
        torch's connect retries overrun its own timeout by seconds, so it runs in a thread we stop waiting for."""
        import datetime

        import torch.distributed as dist
        where = f"MASTER_ADDR:MASTER_PORT={addr}:{port}"
        box: dict[str, Any] = {}

        def make() -> None:
            try:        # multi_tenant: a later init() in this process shares the server, as torch's env:// does
                box["store"] = dist.TCPStore(addr, port, world, server, timeout=datetime.timedelta(seconds=timeout_s),
                                             multi_tenant=server)
            except Exception as e:  # noqa: BLE001 - torch raises DistNetworkError, DistStoreError, RuntimeError
                box["error"] = e
        t = threading.Thread(target=make, name="slicetrace-store-connect", daemon=True)
        t.start()
        t.join(timeout_s)
        if "store" in box:
            return cls(box["store"], where)
        if t.is_alive():                    # torch's own timeout (timeout_s) ends it, seconds late at worst
            if not _CONNECTING:
                atexit.register(_join_connecting)
            _CONNECTING.append((t, timeout_s + 5.0))
        err = box.get("error")
        timed_out = err is None or "timed out" in str(err).lower()
        torch_says = "" if err is None else f" (torch: {_first_line(err)})"
        if server and timed_out:            # it listens at once, then waits for every rank to connect
            msg = (f"rendezvous: rank 0 of {world} hosts the TCPStore at {where}, and the other ranks did not all "
                   f"connect within timeout_s={timeout_s:g}{torch_says}; did every rank start, with the same "
                   f"MASTER_ADDR and MASTER_PORT?")
        elif server:
            msg = (f"rendezvous: rank 0 of {world} could not host the TCPStore at {where}{torch_says}; is that "
                   f"address this host's, and the port free?")
        else:
            msg = (f"rendezvous: rank {rank} of {world} could not connect to the TCPStore at {where}"
                   + (f" within timeout_s={timeout_s:g}" if timed_out else "") + f"{torch_says}; is rank 0 (or "
                   f"torchrun's agent) running, and do MASTER_ADDR and MASTER_PORT name its host and port?")
        raise (CommTimeoutError if timed_out else PeerError)(msg)

    def set(self, key: str, value: bytes) -> None:
        try:
            self._s.set(key, value)
        except Exception as e:  # noqa: BLE001 - torch's error types differ by version
            raise self._lost(e) from None

    def claim(self, key: str, value: bytes) -> bytes:
        try:
            return bytes(self._s.compare_set(key, b"", value))     # sets only a key that is not there
        except Exception as e:  # noqa: BLE001
            raise self._lost(e) from None

    def try_get(self, key: str) -> bytes | None:
        try:
            if not self._s.check([key]):
                return None
            return bytes(self._s.get(key))
        except Exception as e:  # noqa: BLE001
            raise self._lost(e) from None

    def _lost(self, e: Exception) -> PeerError:
        return PeerError(f"rendezvous: the store at {self._where} failed (torch: {_first_line(e)}); did rank 0 or "
                         f"torchrun's agent, which hosts it, exit?")

    def delete(self, key: str) -> None:
        try:
            self._s.delete_key(key)
        except Exception:  # noqa: BLE001 - a store without deletion keeps the key
            pass


def _first_line(e: BaseException) -> str:
    """torch's message without the C++ backtrace that some versions append."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"
