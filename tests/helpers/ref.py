"""Independent numpy references for the collectives (float64 math, then cast like the library)."""
from __future__ import annotations

import importlib.util

import numpy as np

# numpy has no bfloat16: ml_dtypes (the test extra) brings it. Its import costs ~0.8 s of CPU, and every rank
# process that unpickles a test function imports this module, so it is imported where a bfloat16 is made.
BF16_MISSING = None if importlib.util.find_spec("ml_dtypes") else \
    "bfloat16 cases skipped: ml_dtypes is not installed"

DTYPES = ["int8", "uint8", "int32", "int64", "float16", "float32", "float64"]       # bfloat16: BF16_DTYPES
BF16_DTYPES = [] if BF16_MISSING else ["bfloat16"]
REDOPS = ["sum", "prod", "min", "max", "avg"]


def skip_without_bf16() -> None:
    """Skip the calling bfloat16 test, printing why, when ml_dtypes is missing."""
    if BF16_MISSING:
        import pytest
        print(f"\n{BF16_MISSING}")
        pytest.skip(BF16_MISSING)


def npdtype(name: str):
    if name == "bfloat16":
        if BF16_MISSING:
            raise RuntimeError(BF16_MISSING)
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def data(seed: int, rank: int, count: int, dtype: str, redop: str) -> np.ndarray:
    rng = np.random.default_rng([seed, rank, count, len(dtype), len(redop)])
    dt = npdtype(dtype)
    if redop == "prod":
        v = rng.choice([1, 1, -1, 2], size=count) if dt.kind != "u" else rng.choice([1, 1, 2], size=count)
    else:
        v = rng.integers(0 if dt.kind == "u" else -9, 10, size=count)
    return v.astype(dt)


def combine(xs, redop: str, dt) -> np.ndarray:
    a = np.stack([x.astype(np.float64) for x in xs])
    r = {"sum": a.sum(0), "avg": a.sum(0), "prod": a.prod(0), "min": np.fmin.reduce(a, 0), "max": np.fmax.reduce(a, 0)}[redop]
    if redop == "avg":
        r = r / len(xs)
        if np.dtype(dt).kind in "iu":
            r = np.trunc(r)
    return r


def expected(op: str, xs: list[np.ndarray], rank: int, root: int, redop: str, dt) -> np.ndarray | None:
    """The output `rank` must hold; None where it must keep what it held before the op (a non-root reduce:
    NCCL uses recvbuff only on the root)."""
    n = len(xs)
    if op == "all_reduce":
        return combine(xs, redop, dt)
    if op == "reduce":
        return combine(xs, redop, dt) if rank == root else None
    if op == "broadcast":
        return xs[root].astype(np.float64)
    if op == "all_gather":
        return np.concatenate(xs).astype(np.float64)
    if op == "reduce_scatter":
        full = combine(xs, redop, dt)
        k = len(full) // n
        return full[rank * k:(rank + 1) * k]
    if op == "all_to_all":
        k = len(xs[0]) // n
        return np.concatenate([x[rank * k:(rank + 1) * k] for x in xs]).astype(np.float64)
    raise ValueError(op)


UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24, "float64": 2.0 ** -53}


def avg_atol(xs, redop: str, dt) -> float | None:
    """Floating avg is NCCL's PreMulSum: each x_i times 1/n, rounded, then summed in the ring's order, each partial
    sum rounded: within 2 n u max|x| of the exact mean (u: the type's unit roundoff). None for other ops."""
    name = str(np.dtype(dt))
    if redop != "avg" or name not in UNIT_ROUNDOFF or not len(xs) or not xs[0].size:
        return None
    return 2 * len(xs) * UNIT_ROUNDOFF[name] * max(float(np.abs(x.astype(np.float64)).max()) for x in xs)


def mismatches(got: np.ndarray, ref: np.ndarray | None, dt, before: np.ndarray | None = None,
               atol: float | None = None) -> int:
    """Wrong elements of `got`. ref None (see expected): every element must still equal `before`, the output's
    copy made before the op, bit for bit."""
    if ref is None:
        if before is None or before.shape != got.shape:
            raise ValueError("an output that must stay untouched needs its copy from before the op")
        return int((got.view(np.uint8).reshape(got.size, -1) != before.view(np.uint8).reshape(got.size, -1))
                   .any(axis=1).sum()) if got.size else 0
    dt = np.dtype(dt)
    g = got.astype(np.float64)
    if dt.kind in "iu":
        return int((g != ref.astype(dt).astype(np.float64)).sum())
    tol = 2e-2 if dt.itemsize == 2 else 1e-6
    return int((~np.isclose(g, ref, rtol=tol, atol=max(tol, atol or 0.0))).sum())
