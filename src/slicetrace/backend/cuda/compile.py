"""NVRTC through CuPy, with a content-addressed disk cache of cubins.

The key covers the source (our .cu/.cuh, includes inlined), the options, the architecture and the
toolchain (NVRTC and CuPy versions) plus `_KEY_VERSION`. Files are `<sha256>.cubin` holding a 4-byte
magic, the sha256 of the payload and the payload; a short or mismatching file is recompiled. Writes go
to a temporary file in the same folder and are renamed over the target, so readers see all or nothing.
"""
from __future__ import annotations

import hashlib
import os
import re
import threading
from pathlib import Path

from ...errors import BackendError, CompileError

_KEY_VERSION = 1
_MAGIC = b"STC1"
KERNEL_DIR = Path(__file__).with_name("kernels")
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')
_lock = threading.Lock()


def load_source(name: str, kernel_dir: Path = KERNEL_DIR) -> str:
    """The kernel file with our own `#include "x.cuh"` lines inlined once each (NVRTC sees one text)."""
    seen: set[str] = set()

    def expand(fname: str) -> list[str]:
        if fname in seen:
            return []
        seen.add(fname)
        try:
            text = (kernel_dir / fname).read_text()
        except OSError as e:
            raise BackendError(f"kernel source {fname!r} is missing from {kernel_dir}: {e}") from None
        out = []
        for line in text.splitlines():
            m = _INCLUDE.match(line)
            if m:
                out.extend(expand(m.group(1)))
            elif line.strip() != "#pragma once":
                out.append(line)
        return out
    return "\n".join(expand(name)) + "\n"


def cache_key(src: str, opts: tuple[str, ...], arch: str, toolchain: str) -> str:
    h = hashlib.sha256()
    for part in (str(_KEY_VERSION), arch, toolchain, *opts, src):
        h.update(part.encode() + b"\x00")        # separator, so ("ab", "c") != ("a", "bc")
    return h.hexdigest()


def toolchain() -> str:
    try:
        import cupy
        from cupy.cuda import nvrtc
        major, minor = nvrtc.getVersion()
        return f"nvrtc-{major}.{minor}/cupy-{cupy.__version__}"
    except Exception as e:          # a broken install never shares keys with a working one
        return f"broken:{type(e).__name__}"


def read_entry(path: Path) -> bytes | None:
    """The cached cubin, or None when the file is missing, short or corrupt."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < 36 or data[:4] != _MAGIC:
        return None
    payload = data[36:]
    if hashlib.sha256(payload).digest() != data[4:36]:
        return None
    return payload


def write_entry(path: Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(_MAGIC + hashlib.sha256(payload).digest() + payload)
    os.replace(tmp, path)


def numbered(src: str) -> str:
    return "\n".join(f"{i:4d} {line}" for i, line in enumerate(src.splitlines(), 1))


def nvrtc_compile(src: str, opts: tuple[str, ...], name: str) -> bytes:
    from cupy.cuda import nvrtc
    prog = nvrtc.createProgram(src, name, (), ())
    try:
        try:
            nvrtc.compileProgram(prog, list(opts))
        except nvrtc.NVRTCError:
            log = nvrtc.getProgramLog(prog)
            raise CompileError(f"NVRTC failed for {name!r} ({' '.join(opts)})\n{log}\n--- source ---\n"
                               f"{numbered(src)}") from None
        return nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def arch_of(device_id: int) -> str:
    from cupy.cuda import runtime
    props = runtime.getDeviceProperties(device_id)
    return f"sm_{props['major']}{props['minor']}"


def get_cubin(kernel_file: str, defines: dict[str, str], arch: str, cache_dir: str,
              assert_warm: bool = False) -> bytes:
    """The cubin of `kernel_file` built with -D`defines` for `arch`, from the cache when possible."""
    src = load_source(kernel_file)
    opts = (f"-arch={arch}", "-std=c++17", *(f"-D{k}={v}" for k, v in sorted(defines.items())))
    path = Path(cache_dir) / f"{cache_key(src, opts, arch, toolchain())}.cubin"
    cubin = read_entry(path)
    if cubin is not None:
        return cubin
    if assert_warm:
        raise BackendError(f"kernel {kernel_file} {defines} is not in the cache {cache_dir} and "
                           f"SLICETRACE_ASSERT_WARM=1 forbids compiling during timed work")
    cubin = nvrtc_compile(src, opts, kernel_file)
    try:
        write_entry(path, cubin)
    except OSError:
        pass                          # an unwritable cache costs a recompile next time, nothing else
    return cubin


class Kernels:
    """Loaded functions per (file, defines) in this process (the current device's context)."""

    def __init__(self, cache_dir: str, arch: str):
        self.cache_dir, self.arch = cache_dir, arch
        self._fn: dict[tuple, tuple[object, int]] = {}

    def function(self, kernel_file: str, name: str, defines: dict[str, str], assert_warm: bool = False) -> int:
        key = (kernel_file, name, tuple(sorted(defines.items())))
        hit = self._fn.get(key)
        if hit is not None:
            return hit[1].ptr
        from cupy.cuda import function
        cubin = get_cubin(kernel_file, defines, self.arch, self.cache_dir, assert_warm)
        with _lock:
            mod = function.Module()
            mod.load(cubin)
            fn = mod.get_function(name)
            self._fn[key] = (mod, fn)        # the module must outlive the function pointer
        return fn.ptr

    def prepare(self, jobs: list[tuple[str, dict[str, str]]], workers: int = 8) -> None:
        """Compile many variants at once (threads: NVRTC runs outside the GIL where CuPy allows it)."""
        from concurrent.futures import ThreadPoolExecutor
        if not jobs:
            return
        # the first compile alone: NVRTC loads its builtins library lazily and that load is not thread safe
        get_cubin(jobs[0][0], jobs[0][1], self.arch, self.cache_dir)
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(jobs)))) as ex:
            list(ex.map(lambda j: get_cubin(j[0], j[1], self.arch, self.cache_dir), jobs[1:]))
