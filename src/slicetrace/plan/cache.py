"""The plan caches: plans are immutable and ops repeat, so planning is off the hot path after the first."""
from __future__ import annotations

import functools
import inspect
from functools import lru_cache
from typing import Any, Callable

_SMALL_PLAN = 4 << 20        # bytes: plans of ops up to this are cached by the thousand, larger ones by the dozen


def plans_cache(nbytes_of: Callable[..., int]) -> Callable:
    """lru caches of immutable plans (ops repeat: planning is off the hot path after the first), split by the op's
    bytes: a plan's memory grows with them (~0.3 KB per FIFO step, 79 KB at 256 MiB), so one cache of 4096 held
    250-630 MB in a run of random large counts."""
    def deco(fn: Callable) -> Callable:
        small, large = lru_cache(maxsize=4096)(fn), lru_cache(maxsize=64)(fn)
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def plan(*args: Any, **kw: Any) -> Any:
            if kw:                          # one key per op, however it is called: all positional, defaults filled
                b = sig.bind(*args, **kw)
                b.apply_defaults()
                args = b.args
            return (small if nbytes_of(*args) <= _SMALL_PLAN else large)(*args)
        plan.caches = (small, large)        # type: ignore[attr-defined]
        return plan
    return deco
