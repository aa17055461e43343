"""tests/cuda: skipped, with the reason printed, where CuPy or a CUDA GPU is missing (CI has neither).

Multi-rank tests run 2 ranks by default; ranks share GPUs round-robin when there are fewer GPUs than
ranks (CUDA IPC works within one device too), so 3- and 4-rank rings run on a 2-GPU machine.
"""
from __future__ import annotations

import pytest


def _reason() -> str | None:
    try:
        import cupy
    except Exception as e:               # noqa: BLE001 - any import failure means no GPU tests
        return f"CuPy is not importable ({type(e).__name__}: {e})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:               # noqa: BLE001
        return f"no CUDA device ({type(e).__name__}: {e})"
    return None if n > 0 else "no CUDA device"


REASON = _reason()


def pytest_report_header(config):
    return f"slicetrace cuda tests: {'SKIPPED: ' + REASON if REASON else 'enabled'}"


@pytest.fixture(scope="session")
def gpu():
    if REASON:
        print(f"\nskipping CUDA test: {REASON}")
        pytest.skip(REASON)


@pytest.fixture(scope="session")
def kcache(tmp_path_factory):
    """One kernel cache for the whole run (ranks compile each variant once); SLICETRACE_CACHE_DIR wins."""
    from slicetrace.config import Settings
    env_dir = Settings.from_env().cache_dir
    default = Settings().cache_dir
    return env_dir if env_dir != default else str(tmp_path_factory.getbasetemp() / "kcache")


@pytest.fixture(scope="module")
def pool2(gpu, kcache):
    from tests.cuda import ranks
    from tests.helpers.procs import RankPool
    pool = RankPool(2, timeout=300)
    try:
        pool.run(ranks.setup, {"cache_dir": kcache, "timeout_s": 20.0})
        yield pool
    finally:
        pool.close()
