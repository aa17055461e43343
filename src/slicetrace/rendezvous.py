"""Key/value stores for rendezvous. Not a home-made protocol: a multiprocessing Manager dict (slicetrace.launch)
or torch.distributed's TCPStore (torchrun). Values are bytes; every get has a timeout."""
from __future__ import annotations

import abc
import time
from typing import Any

from .errors import CommTimeoutError


class Store(abc.ABC):
    @abc.abstractmethod
    def set(self, key: str, value: bytes) -> None: ...

    @abc.abstractmethod
    def try_get(self, key: str) -> bytes | None: ...

    def get(self, key: str, timeout_s: float, what: str = "") -> bytes:
        deadline = time.monotonic() + timeout_s
        delay = 1e-4
        while True:
            v = self.try_get(key)
            if v is not None:
                return v
            if time.monotonic() > deadline:
                raise CommTimeoutError(f"rendezvous: {what or key!r} did not arrive within timeout_s={timeout_s}")
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def barrier(self, name: str, rank: int, world: int, timeout_s: float) -> None:
        self.set(f"{name}/{rank}", b"1")
        for r in range(world):
            self.get(f"{name}/{r}", timeout_s, what=f"rank {r} at barrier {name!r}")


class DictStore(Store):
    """Over a dict-like object: a multiprocessing.Manager().dict() proxy shared by spawned ranks, or a plain dict."""

    def __init__(self, mapping: Any):
        self._d = mapping

    def set(self, key: str, value: bytes) -> None:
        self._d[key] = value

    def try_get(self, key: str) -> bytes | None:
        return self._d.get(key)


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
