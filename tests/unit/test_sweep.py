import re

import numpy as np
import pytest

from slicetrace.cli.sweep import avg_atol, counts, distinct_sizes, make_input, parse_size, reference, sizes, wrong
from slicetrace.errors import UsageError
from slicetrace.plan.traffic import busbw_factor, message_bytes


def test_sizes_follow_nccl_tests_flags():
    assert parse_size("4K", "-b") == 4096 and parse_size("64M", "-e") == 64 << 20 and parse_size("8", "-b") == 8
    assert sizes(8, 64, 2) == [8, 16, 32, 64]
    with pytest.raises(UsageError, match=r"-b='4Q' is not a size"):
        parse_size("4Q", "-b")
    with pytest.raises(UsageError, match=r"-f -1 must be >= 2 \(a factor\), or 0 or 1 \(step by -i"):
        sizes(8, 64, -1)
    assert sizes(0, 4, None) == [0, 1, 2, 4]                      # -f defaults to 2
    assert sizes(1 << 20, 4 << 20, None, 1 << 20) == [1 << 20, 2 << 20, 3 << 20, 4 << 20]   # -i: additive
    assert sizes(10, 25, None, 10) == [10, 20]
    with pytest.raises(UsageError, match=r"-f 4 and -i 8: give one"):
        sizes(8, 64, 4, 8)
    with pytest.raises(UsageError, match=r"-i 0 must be >= 1 byte"):
        sizes(8, 64, None, 0)
    with pytest.raises(UsageError, match=r"makes 1073741817 sizes; at most 10000"):
        sizes(8, 1 << 30, None, 1)


def test_sizes_are_ascii_digits():
    with pytest.raises(UsageError, match=r"-b='\u0664K' is not a size"):
        parse_size("\u0664K", "-b")


def test_sizes_read_as_nccl_tests_parsesize_reads_them():
    """nccl-tests reads a size with sscanf("%lf %1s"): decimals, exponents and KiB-style suffixes; -b 1.5M was
    refused here."""
    assert parse_size("1.5M", "-b") == 3 << 19 and parse_size("1e6", "-e") == 10 ** 6
    assert parse_size("4KiB", "-b") == parse_size("4kb", "-b") == parse_size("4 K", "-b") == 4096
    assert parse_size("2.5", "-b") == 2 and parse_size("0.5K", "-b") == 512 and parse_size("1.", "-b") == 1
    for bad in ("2Gx", "1..5M", "-1K", "1e", "K"):
        with pytest.raises(UsageError, match=rf"^-b='{re.escape(bad)}' is not a size \(e\.g\. 8, 4K, 1\.5M"):
            parse_size(bad, "-b")
    with pytest.raises(UsageError, match=r"accepted at most 1,152,921,504,606,846,976"):
        parse_size("1e30", "-b")


@pytest.mark.timeout(5)
@pytest.mark.parametrize("huge", ["1e999999", "1e999999999999", "1e30"])
def test_a_size_past_any_exponent_is_refused_at_once(huge):
    """1e999999 took 27-35 s to become a million-digit int before the bound was checked; 1e999999999999 was named
    as 1,152,921,504,606,846,977 bytes, a number it is not."""
    with pytest.raises(UsageError, match=rf"^-b='{huge}': accepted at most 1,152,921,504,606,846,976 bytes "
                                         r"\(2\*\*60\)$"):
        parse_size(huge, "-b")


def test_a_factor_of_0_or_1_steps_by_i_as_nccl_tests_does():
    """nccl-tests steps by -i (default 1 MiB) when -f is not above 1; -f 1 was an error here."""
    assert sizes(0, 3 << 20, 1) == [0, 1 << 20, 2 << 20, 3 << 20]
    assert sizes(8, 40, 1, 16) == sizes(8, 40, 0, 16) == [8, 24, 40]
    with pytest.raises(UsageError, match=r"-f 4 and -i 8: give one .*-f 1 -i 8 steps by -i"):
        sizes(8, 64, 4, 8)


def test_sizes_of_the_same_element_count_make_one_row():
    """-b 0 steps 0, 1, 2, 4 B: float32 makes 0, 0, 0, 1 elements, and one zero-element row, not three."""
    assert distinct_sizes(sizes(0, 16, 2), "all_reduce", 4, 2) == [0, 4, 8, 16]
    assert distinct_sizes(sizes(0, 16, 2), "all_reduce", 1, 2) == [0, 1, 2, 4, 8, 16]
    assert distinct_sizes([4, 5, 6, 7, 8], "all_reduce", 4, 2) == [4, 8]            # -i 1: 1, 1, 1, 1, 2 elements
    # all_gather counts per rank: 4..8 B of float32 over 3 ranks are all 0 elements each
    assert distinct_sizes([0, 4, 8, 12, 16], "all_gather", 4, 3) == [0, 12]
    assert distinct_sizes([], "all_reduce", 4, 2) == []


def test_busbw_factors_are_nccl_tests():
    assert busbw_factor("all_reduce", 4) == 1.5 and busbw_factor("all_gather", 4) == 0.75
    assert busbw_factor("reduce_scatter", 8) == 0.875 and busbw_factor("broadcast", 8) == 1.0
    assert busbw_factor("all_to_all", 4) == 0.75 and busbw_factor("all_to_all", 2) == 0.5
    assert busbw_factor("reduce", 8) == 1.0 and busbw_factor("send_recv", 2) == 1.0


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"])
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_message_bytes_is_the_bench_s_size(op, n):
    """The inspector's coll_msg_size_bytes (from the Coll's per-rank count) is the size bench prints for the op: the
    whole buffer for all_gather (output) and reduce_scatter (input)."""
    for nbytes in (0, 4, 4096, 1 << 20, 12_345_676):
        cin, cout = counts(op, nbytes, 4, n)
        bench_size = (cout if op == "all_gather" else cin) * 4        # bench.py's row["size"]
        per_rank = cout if op == "reduce_scatter" else cin      # the Coll's count (api.py: per rank)
        assert message_bytes(op, per_rank, 4, n) == bench_size


def test_counts_per_op():
    assert counts("all_gather", 4096, 4, 4) == (256, 1024)
    assert counts("reduce_scatter", 4096, 4, 4) == (1024, 256)
    assert counts("all_reduce", 4096, 4, 4) == (1024, 1024)


def test_reference_and_wrong_count():
    xs = [make_input(1, r, 8, np.int32, "sum") for r in range(3)]
    ref = reference("all_reduce", xs, 0, 0, "sum")
    assert wrong(sum(x.astype(np.int64) for x in xs).astype(np.int32), ref, np.int32) == 0
    bad = ref.astype(np.int32)
    bad[3] += 1
    assert wrong(bad, ref, np.int32) == 1
    assert reference("reduce", xs, 1, 0, "sum") is None


def test_timed_blocks_run_with_the_collector_off_and_overhead_blocks_with_it_on():
    import gc

    from slicetrace.cli.bench import _time
    seen = []
    assert gc.isenabled()
    t = _time(lambda: seen.append(gc.isenabled()), 3, lambda: None)
    assert t >= 0 and seen == [False] * 3 and gc.isenabled()
    _time(lambda: seen.append(gc.isenabled()), 2, lambda: None, collector_off=False)
    assert seen[3:] == [True, True]
    with pytest.raises(ZeroDivisionError):       # an error in the block still turns the collector back on
        _time(lambda: 1 / 0, 1, lambda: None)
    assert gc.isenabled()


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"])
def test_in_place_buffers_are_laid_out_as_nccl_tests_does_and_reset_restores_the_input(op):
    from slicetrace.cli.bench import _buffers
    rank, n, dt = 1, 3, np.dtype(np.int32)
    cin, cout = counts(op, 96, 4, n)
    host_in = np.arange(cin, dtype=dt) + 5
    x, out, reset = _buffers(op, True, host_in, cin, cout, rank, np, lambda a: a.copy(), dt)
    assert x.size == cin and out.size == cout
    if op == "all_gather":
        assert np.shares_memory(x, out) and x.ctypes.data == out.ctypes.data + rank * cin * 4
    elif op == "reduce_scatter":
        assert out.ctypes.data == x.ctypes.data + rank * cout * 4
    elif op == "all_to_all":
        assert not np.shares_memory(x, out)          # no in-place form: out of place
    else:
        assert out is x
    out[...] = 0                                     # what an op leaves behind
    if op != "all_to_all":                           # out of place, the input is never written
        x[...] = 1
    reset()
    assert (x == host_in).all()
    if op in ("all_gather", "all_to_all"):
        rest = np.delete(out, np.arange(rank * cin, (rank + 1) * cin)) if op == "all_gather" else out
        assert (rest == -77).all()


def test_bench_dtypes_on_cuda_need_a_cupy_bfloat16(monkeypatch):
    import sys
    import types
    from slicetrace.cli.sweep import all_dtypes, bench_dtype
    pytest.importorskip("ml_dtypes")
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(__version__="14.2.0"))   # no bfloat16
    assert "bfloat16" not in all_dtypes("cuda") and "bfloat16" in all_dtypes("cpu")
    with pytest.raises(UsageError, match=r"-d bfloat16 on cuda: this CuPy \(14.2.0\) has no bfloat16"):
        bench_dtype("bfloat16", "cuda")
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(__version__="99", bfloat16=object()))
    assert all_dtypes("cuda")[-1] == "bfloat16"


def test_a_float16_premul_avg_is_within_avg_atol_and_not_within_the_plain_tolerance():
    """A real PreMulSum in float16 (each input times fl(1/5), summed in ring order) of inputs up to 2000 whose mean
    is near 0: its rounding error (~0.4) is far past float16's atol 2e-2 + rtol * |mean|, yet within avg_atol's
    2 n u max|x| = 2 * 5 * 2**-11 * 2000, which wrong() must take in place of its own smaller atol."""
    from slicetrace.backend.cpu.worker import premul
    rng = np.random.default_rng(3)
    xs = [rng.integers(-1000, 1001, size=256).astype(np.float16) for _ in range(4)]
    last = -sum(x.astype(np.float64) for x in xs) + rng.integers(-3, 4, size=256)     # a mean near 0
    xs.append(last.clip(-2000, 2000).astype(np.float16))
    c = premul(np.dtype(np.float16), "avg", 5)
    out = xs[0] * c
    for x in xs[1:]:
        out = out + x * c
    assert out.dtype == np.float16
    ref = reference("all_reduce", xs, 0, 0, "avg")
    atol = avg_atol(xs, "avg", np.float16)
    assert atol == 2 * 5 * 2.0 ** -11 * 2000
    assert wrong(out, ref, np.float16) > 0                   # the premul error is real
    assert wrong(out, ref, np.float16, atol) == 0
    bad = out.copy()
    bad[7] = ref[7] + 2 * atol                               # a real error past the bound is still counted
    assert wrong(bad, ref, np.float16, atol) == 1


def test_avg_atol_is_2_n_u_max_for_floating_avg_and_0_otherwise():
    xs = [np.array([1.0, -3.0], np.float32), np.array([2.0, 0.5], np.float32), np.array([0.0, 1.0], np.float32)]
    assert avg_atol(xs, "avg", np.float32) == 2 * 3 * 2.0 ** -24 * 3.0
    assert avg_atol(xs, "sum", np.float32) == 0.0
    assert avg_atol([x.astype(np.int32) for x in xs], "avg", np.int32) == 0.0      # SumPostDiv: exact
    assert avg_atol([np.zeros(0, np.float32)] * 2, "avg", np.float32) == 0.0


def test_integer_inputs_reach_the_types_limits_and_the_reference_stays_exact():
    """The bench drew integers from -8..8 (prod: 1, -1, 2): no sum or product ever wrapped, so a backend that got
    wrapping wrong still showed #wrong 0. With values near the limits, int64 min/max and the data-movement ops'
    references went through float64, which rounds past 2**53, and flagged right results as wrong."""
    xs = [make_input(1, r, 70, np.int64, "max") for r in range(3)]
    assert max(int(abs(v)) for x in xs for v in x) > 2 ** 62          # near the limits
    for op, redop, want in (("all_reduce", "max", np.maximum.reduce(xs)), ("all_reduce", "min", np.minimum.reduce(xs)),
                            ("broadcast", "sum", xs[0]), ("all_gather", "sum", np.concatenate(xs))):
        ref = reference(op, xs, 1, 0, redop)
        assert wrong(want, ref, np.int64) == 0, op
    s8 = [make_input(1, r, 70, np.int8, "sum") for r in range(4)]
    total = np.sum([x.astype(np.int64) for x in s8], 0)
    assert (np.abs(total) > 127).any()                                 # some int8 sums wrap
    assert wrong(np.sum(s8, 0, dtype=np.int8), reference("all_reduce", s8, 0, 0, "sum"), np.int8) == 0


def test_a_sweep_past_the_available_memory_is_refused_naming_e_and_b_as_typed():
    """`bench -e 64G` on a 24 GiB host failed after the launch, once per rank."""
    from slicetrace.cli.sweep import memory_check
    sizes_, mib = [1 << 20, 1 << 30], (1 << 20, "test")
    memory_check(sizes_, ["all_reduce"], ["float32"], 2, False, True, ("1M", "1G"), (8 << 30, "test"))   # 4 GiB
    with pytest.raises(UsageError) as e:
        memory_check(sizes_, ["all_reduce", "all_gather"], ["float32"], 2, True, True, ("1M", "1G"), (8 << 30, "x"))
    assert str(e.value) == (
        "-e 1G (the sweep's largest size: 1,073,741,824 B): all_reduce of 1,073,741,824 B (float32) needs about "
        "8,589,934,592 B per rank (2,147,483,648 for its buffers + 6,442,450,944 to check it, which -c 0 skips), "
        "17,179,869,184 B over 2 ranks, more than the 8,589,934,592 B of memory available (x); give a smaller -e")
    with pytest.raises(UsageError, match=r"give a smaller -e, and a smaller -b than 1M$"):
        memory_check(sizes_, ["all_reduce"], ["int8"], 2, False, True, ("1M", "1G"), mib)
    # cuda: the buffers are the GPUs' (the ranks check them); the check's are the host's
    memory_check(sizes_, ["all_reduce"], ["float32"], 2, False, False, ("1M", "1G"), mib)
    with pytest.raises(UsageError, match=r"per rank \(6,442,450,944 to check it, which -c 0 skips\), "):
        memory_check(sizes_, ["all_reduce"], ["float32"], 2, True, False, ("1M", "1G"), (8 << 30, "x"))
    memory_check(sizes_, ["all_reduce"], ["float32"], 2, True, True, ("1M", "1G"), None)     # unknown: the ranks'


def test_available_memory_is_read_on_linux():
    from slicetrace.cli.sweep import available_memory
    got = available_memory()
    assert got is not None and got[0] > 0 and got[1]
