"""Kernel cache and compile errors (needs CuPy's NVRTC; no GPU)."""
from __future__ import annotations

import pytest

from slicetrace.backend.cuda import compile as kc
from slicetrace.errors import BackendError, CompileError


def _nvrtc_reason():
    try:
        from cupy.cuda import nvrtc
        nvrtc.getVersion()
    except Exception as e:           # noqa: BLE001
        return f"NVRTC through CuPy is not available ({type(e).__name__}: {e})"
    return None


needs_nvrtc = pytest.mark.skipif(_nvrtc_reason() is not None, reason=str(_nvrtc_reason()))


def test_key_separates_parts():
    assert kc.cache_key("ab", ("c",), "sm_90", "t") != kc.cache_key("a", ("bc",), "sm_90", "t")
    assert kc.cache_key("s", (), "sm_90", "t") != kc.cache_key("s", (), "sm_80", "t")


def test_entry_roundtrip_and_corruption(tmp_path):
    p = tmp_path / "x.cubin"
    kc.write_entry(p, b"payload")
    assert kc.read_entry(p) == b"payload"
    p.write_bytes(p.read_bytes()[:-1] + b"X")
    assert kc.read_entry(p) is None
    p.write_bytes(b"STC1")
    assert kc.read_entry(p) is None
    assert not list(tmp_path.glob("*.tmp"))


def test_source_inlines_our_headers():
    src = kc.load_source("slicetrace.cu")
    assert '#include "' not in src and "struct Args" in src and src.count("struct Args {") == 1


@needs_nvrtc
def test_compile_cache_warm_and_corrupt(tmp_path):
    d = {"ST_T": "float", "ST_STEPS": "0"}
    cubin = kc.get_cubin("slicetrace.cu", d, "sm_90", str(tmp_path))
    files = list(tmp_path.glob("*.cubin"))
    assert len(files) == 1
    assert kc.get_cubin("slicetrace.cu", d, "sm_90", str(tmp_path), assert_warm=True) == cubin
    files[0].write_bytes(b"garbage")
    with pytest.raises(BackendError, match="SLICETRACE_ASSERT_WARM=1"):
        kc.get_cubin("slicetrace.cu", d, "sm_90", str(tmp_path), assert_warm=True)
    assert kc.get_cubin("slicetrace.cu", d, "sm_90", str(tmp_path)) == cubin


@needs_nvrtc
def test_compile_error_shows_log_and_numbered_source():
    with pytest.raises(CompileError) as ei:
        kc.nvrtc_compile("__global__ void f() {\n  int x = ;\n}\n", ("-arch=sm_90",), "bad.cu")
    msg = str(ei.value)
    assert "NVRTC failed for 'bad.cu' (-arch=sm_90)" in msg and "expected an expression" in msg
    assert "   2   int x = ;" in msg


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_75", "sm_90"])
def test_bfloat16_kernels_compile_below_sm_80_and_use_the_hardware_cvt_from_it(arch):
    """cvt.rn.bf16.f32 needs sm_80: on a V100 or T4 every bfloat16 kernel failed in ptxas, and prepare() with the
    default dtypes with it. Below sm_80 the conversion rounds to nearest even by hand."""
    from cupy.cuda import nvrtc
    src = kc.load_source("slicetrace.cu")
    prog = nvrtc.createProgram(src, "slicetrace.cu", [], [])
    try:
        nvrtc.compileProgram(prog, [f"-arch=compute_{arch[3:]}", "-std=c++17", "-DST_STEPS=0", "-DST_T=b16"])
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    assert ("cvt.rn.bf16.f32" in ptx) == (arch == "sm_90")
    kc.nvrtc_compile(src, (f"-arch={arch}", "-std=c++17", "-DST_STEPS=0", "-DST_T=b16"), "slicetrace.cu")   # to SASS
