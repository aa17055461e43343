"""nccl-tests vocabulary: sizes, dtypes, per-op counts, references for the check (busbw factors: plan.traffic)."""
from __future__ import annotations

import os
import re
from decimal import Decimal

import numpy as np

from ..backend.base import DTYPES
from ..errors import UsageError, plural

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "send_recv")
DTYPE_ALIASES = {"int8": "int8", "char": "int8", "uint8": "uint8", "int32": "int32", "int": "int32",
                 "int64": "int64", "half": "float16", "float16": "float16", "float": "float32",
                 "float32": "float32", "double": "float64", "float64": "float64", "bfloat16": "bfloat16"}
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MAX_BYTES = 1 << 60         # past any memory (a failed allocation says what it needs), below numpy's index limit


def parse_size(text: str, what: str) -> int:
    """A size as nccl-tests' parsesize reads it: a decimal number (1.5, 1e6) and an optional K, M or G (x 1024**n;
    KB, KiB alike), truncated to whole bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?(?:E[+-]?[0-9]+)?)\s*(?:([KMG]?)(?:I?B)?)\s*", str(text).upper())
    if not m:                                       # [0-9], not \d: \d takes any script's digits
        raise UsageError(f"{what}={text!r} is not a size (e.g. 8, 4K, 1.5M, 1e6, 1G)")
    try:
        d = Decimal(m.group(1)) * _UNITS[m.group(2)]
    except ArithmeticError:                         # an exponent past Decimal's range
        d = None
    if d is None or d.adjusted() >= 30:             # no int of a million digits (1e999999 took 35 s)
        raise UsageError(f"{what}={text!r}: accepted at most {MAX_BYTES:,} bytes (2**60)")
    n = int(d)
    if n > MAX_BYTES:
        raise UsageError(f"{what}={text!r} is {n:,} bytes: accepted at most {MAX_BYTES:,} (2**60)")
    return n


def shm_check(nranks: int, settings) -> None:
    """cpu: refuse, before any rank starts, a run whose ranks' segments together would not fit in /dev/shm."""
    from ..backend.cpu.shm import shm_shortfall
    why = shm_shortfall(nranks, settings.channels, settings.buffsize, settings.ring_slots, settings.cpu_pool)
    if why is not None:
        raise UsageError(f"--ranks {nranks}: {why}, or give fewer --ranks or --channels")


def rank_bytes(op: str, nbytes: int, itemsize: int, n: int, check: bool) -> tuple[int, int]:
    """(bytes of one rank's buffers, bytes more its check takes: every rank's input and the float64 reference) for
    one size of the sweep."""
    cin, cout = counts(op, nbytes, itemsize, n)
    return (cin + cout) * itemsize, n * cin * (itemsize + 8) if check else 0


def available_memory() -> tuple[int, str] | None:
    """(bytes this host can still give, where that was read), or None where unknown: MemAvailable, or a cgroup's
    limit less its use when lower (a container sees the host's /proc/meminfo)."""
    got = None
    try:
        with open("/proc/meminfo") as f:
            kb = next((int(ln.split()[1]) for ln in f if ln.startswith("MemAvailable:")), None)
        got = None if kb is None else (kb << 10, "MemAvailable in /proc/meminfo")
    except (OSError, ValueError):
        pass
    if got is None and hasattr(os, "sysconf"):
        try:
            got = (os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free pages (sysconf)")
        except (OSError, ValueError):
            pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f, open("/sys/fs/cgroup/memory.current") as g:
            limit, used = f.read().strip(), int(g.read())
        if limit != "max" and (got is None or int(limit) - used < got[0]):
            got = (max(0, int(limit) - used), "this cgroup's memory.max less memory.current")
    except (OSError, ValueError):
        pass
    return got


def memory_check(sizes: list[int], ops: list[str], dtypes: list, nranks: int, check: bool, host_buffers: bool,
                 flags: tuple[str, str], available: tuple[int, str] | None) -> None:
    """Refuse, before any rank starts, a sweep whose largest size needs more memory over all ranks than the host
    has available (host_buffers: the buffers are in host memory, as on cpu; the check's always are). flags: -b and
    -e as typed. The ranks still catch what this misses (bench._memory)."""
    if available is None or not sizes:
        return

    def need(nbytes: int) -> tuple[int, str, str, int, int]:
        return max((b * host_buffers + c, op, str(np_dtype(d)), b, c) for op in ops for d in dtypes
                   for b, c in [rank_bytes(op, nbytes, np_dtype(d).itemsize, nranks, check)])
    total, op, dtype, buf, chk = need(sizes[-1])
    if total * nranks <= available[0]:
        return
    parts = ([f"{buf:,} for its buffers"] if host_buffers else []) + (
        [f"{chk:,} to check it, which -c 0 skips"] if chk else [])
    flag = f"-e {flags[1]}" + (f" (the sweep's largest size: {sizes[-1]:,} B)" if flags[1] != str(sizes[-1]) else "")
    low = need(sizes[0])[0] * nranks > available[0]             # the smallest size alone does not fit
    raise UsageError(f"{flag}: {op} of {sizes[-1]:,} B ({dtype}) needs about {total:,} B per rank "
                     f"({' + '.join(parts)}), "
                     f"{total * nranks:,} B over {plural(nranks, 'rank')}, more than the {available[0]:,} B of "
                     f"memory available ({available[1]}); give a smaller -e"
                     + (f", and a smaller -b than {flags[0]}" if low else ""))


MAX_SIZES = 10_000          # a sweep longer than this is a typo in -i, not a benchmark


def sizes(minbytes: int, maxbytes: int, factor: int | None = 2, step: int | None = None) -> list[int]:
    """nccl-tests' sweep: minbytes, then times factor (-f 2 or more) or plus step (-i; -f 0 or 1 steps by -i,
    1 MiB without it, as nccl-tests), up to maxbytes."""
    if minbytes < 0 or maxbytes < minbytes:
        raise UsageError(f"-b {minbytes} / -e {maxbytes}: need 0 <= minbytes <= maxbytes")
    if factor is not None and factor < 0:
        raise UsageError(f"-f {factor} must be >= 2 (a factor), or 0 or 1 (step by -i, as nccl-tests)")
    if factor is not None and factor <= 1:
        step = 1 << 20 if step is None else step
    elif step is not None and factor is not None:
        raise UsageError(f"-f {factor} and -i {step}: give one (a factor or an increment; -f 1 -i {step} steps by "
                         f"-i, as nccl-tests)")
    if step is not None:
        if step < 1:
            raise UsageError(f"-i {step} must be >= 1 byte")
        n = (maxbytes - minbytes) // step + 1
        if n > MAX_SIZES:
            raise UsageError(f"-b {minbytes} -e {maxbytes} -i {step} makes {n} sizes; at most {MAX_SIZES}: "
                             f"a larger -i, or -f")
        return list(range(minbytes, maxbytes + 1, step))
    factor = 2 if factor is None else factor
    out, s = [], minbytes
    while s <= maxbytes:
        out.append(s)
        s = s * factor if s else 1
    return out


def distinct_sizes(sizes: list[int], op: str, itemsize: int, n: int) -> list[int]:
    """The sizes whose element counts differ from the previous kept size's (nccl-tests prints a row for each size,
    repeats too): -b 0 with float32 makes 0, 1, 2 B, all zero elements, and one zero-element row here."""
    out, last = [], None
    for s in sizes:
        c = counts(op, s, itemsize, n)
        if c != last:
            out.append(s)
            last = c
    return out


def bench_dtype(name: str, backend: str) -> str:
    """`name` if the bench can make its arrays on `backend` (bfloat16: ml_dtypes, and on cuda a CuPy with a
    bfloat16 dtype; the library itself takes bfloat16 through torch); UsageError otherwise."""
    if name == "bfloat16":
        np_dtype(name)
        if backend == "cuda":
            try:
                import cupy
            except ImportError:
                return name             # the backend reports a missing CuPy itself
            if not hasattr(cupy, "bfloat16"):
                raise UsageError(f"-d bfloat16 on cuda: this CuPy ({cupy.__version__}) has no bfloat16 arrays for "
                                 f"the bench's buffers (the library takes torch bfloat16 tensors)")
    return name


def all_dtypes(backend: str = "cpu", left_out: list[str] | None = None) -> list[str]:
    """-d all: every dtype the bench can make arrays of on `backend`, as nccl-tests runs all it has; why each
    other one is left out is appended to left_out."""
    names = []
    if left_out is not None:            # nccl-tests' -d all has them: say why they are not here
        left_out.append("uint32, uint64 left out: slicetrace's backends have no unsigned 32- or 64-bit types")
    for n in DTYPES:
        try:
            names.append(bench_dtype(n, backend))
        except UsageError as e:
            if left_out is not None:
                left_out.append(f"{n} left out: {e}")
    return names


def np_dtype(name: str):
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise UsageError("-d bfloat16 needs the ml_dtypes package on cpu") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def counts(op: str, nbytes: int, itemsize: int, n: int) -> tuple[int, int]:
    """(input elements, output elements) per rank; nccl-tests' size is the larger buffer for AG/RS/A2A."""
    c = nbytes // itemsize
    if op in ("all_gather",):
        c = c // n
        return c, c * n
    if op in ("reduce_scatter",):
        c = (c // n) * n
        return c, c // n
    if op == "all_to_all":
        c = (c // n) * n
        return c, c
    return c, c


def make_input(seed: int, rank: int, count: int, dtype, redop: str) -> np.ndarray:
    rng = np.random.default_rng([seed, rank, count])
    dt = np.dtype(dtype)
    if redop == "prod":
        v = rng.choice(np.array([1, -1, 1, 2], dtype=np.int64), size=count)
    elif dt.kind == "u":
        v = rng.integers(0, 8, size=count)
    else:
        v = rng.integers(-8, 9, size=count)
    if dt.kind in "iu" and count:   # one value in 7 near the type's limits: sums and products wrap, int64 is exact
        info = np.iinfo(dt)
        edge = rng.integers(info.min, info.max, size=count, endpoint=True)
        v = np.where(np.arange(count) % 7 == 3, np.where(edge % 2 == 0, 3, -3) if redop == "prod" else edge, v)
    return v.astype(dtype)


def _exact(x: np.ndarray) -> np.ndarray:
    """int64 for integer types (float64 rounds int64 past 2**53), else float64."""
    return x.astype(np.int64 if x.dtype.kind in "iu" else np.float64)


def _combine(xs: list[np.ndarray], redop: str) -> np.ndarray:
    if xs[0].dtype.kind in "iu":
        # in int64, which wraps mod 2**64 and so mod every narrower width (float64 lost it past 2**53: 255**4
        # cast to uint8 gave 0, not 1); avg: the sum wrapped in the type, then divided toward zero, as NCCL does
        acc = np.stack([x.astype(np.int64) for x in xs])
        if redop in ("min", "max"):
            return (acc.min if redop == "min" else acc.max)(0)
        with np.errstate(over="ignore"):
            r = acc.prod(0) if redop == "prod" else acc.sum(0)
        if redop == "avg":
            r = r.astype(xs[0].dtype).astype(np.int64)
            r = np.sign(r) * (np.abs(r) // len(xs))
        return r
    acc = np.stack([x.astype(np.float64) for x in xs])
    if redop in ("sum", "avg"):
        r = acc.sum(0)
        return r / len(xs) if redop == "avg" else r
    if redop == "prod":                 # only the one asked for: this runs for every size checked
        return acc.prod(0)
    return (np.fmin if redop == "min" else np.fmax).reduce(acc, 0)


def reference(op: str, inputs: list[np.ndarray], rank: int, root: int, redop: str) -> np.ndarray | None:
    """Expected output of `rank` (float64; int64 for integer types), or None where the output is unspecified
    (reduce, non-root)."""
    n = len(inputs)
    if op == "all_reduce":
        return _combine(inputs, redop)
    if op == "reduce":
        return _combine(inputs, redop) if rank == root else None
    if op == "broadcast":
        return _exact(inputs[root])
    if op == "all_gather":
        return _exact(np.concatenate(inputs))
    if op == "reduce_scatter":
        full = _combine(inputs, redop)
        k = len(full) // n
        return full[rank * k:(rank + 1) * k]
    if op == "all_to_all":
        k = len(inputs[0]) // n
        return _exact(np.concatenate([x[rank * k:(rank + 1) * k] for x in inputs]))
    if op == "send_recv":
        return _exact(inputs[(rank - 1) % n])
    raise UsageError(f"--op {op!r} is not one of {OPS}")


_UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24, "float64": 2.0 ** -53}


def avg_atol(inputs: list[np.ndarray], redop: str, dtype) -> float:
    """Floating avg is NCCL's PreMulSum (each input times 1/n, rounded, summed in ring order): within 2 n u max|x|
    of the exact mean (u: the type's unit roundoff); 0 for every other op."""
    name = str(np.dtype(dtype))
    if redop != "avg" or name not in _UNIT_ROUNDOFF or not inputs or not inputs[0].size:
        return 0.0
    return 2 * len(inputs) * _UNIT_ROUNDOFF[name] * max(float(np.abs(x.astype(np.float64)).max()) for x in inputs)


def wrong(out: np.ndarray, ref: np.ndarray | None, dtype, atol: float = 0.0) -> int:
    if ref is None:
        return 0
    got = np.asarray(out).astype(np.float64)
    kind = np.dtype(dtype)
    if kind.kind in "iu":
        return int((np.asarray(out) != ref.astype(kind)).sum())     # integer overflow wraps, as in NCCL
    tol = {2: 2e-2, 4: 1e-5, 8: 1e-12}[kind.itemsize]
    return int((~np.isclose(got, ref, rtol=tol, atol=max(tol, atol))).sum())
