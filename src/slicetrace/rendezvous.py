"""Key/value stores for rendezvous. Not a home-made protocol: a multiprocessing Manager dict (slicetrace.launch)
or torch.distributed's TCPStore (torchrun). Values are bytes; every get has a timeout."""
from __future__ import annotations

import abc
import time
from typing import Any, Callable

from .errors import CommTimeoutError, SliceTraceError

CHECK_AFTER_S = 0.01        # a wait this long starts asking `check` whether to give up (then every CHECK_EVERY_S)
CHECK_EVERY_S = 0.05


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
        self._d[key] = value

    def try_get(self, key: str) -> bytes | None:
        return self._d.get(key)

    def delete(self, key: str) -> None:
        self._d.pop(key, None)


class TorchStore(Store):
    """torch.distributed.TCPStore (torchrun: MASTER_ADDR/MASTER_PORT), or a store torch already made."""

    def __init__(self, store: Any):
        self._s = store

    def set(self, key: str, value: bytes) -> None:
        self._s.set(key, value)

    def try_get(self, key: str) -> bytes | None:
        if not self._s.check([key]):
            return None
        return bytes(self._s.get(key))

    def delete(self, key: str) -> None:
        try:
            self._s.delete_key(key)
        except Exception:  # noqa: BLE001 - a store without deletion keeps the key
            pass
