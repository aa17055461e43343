"""What each setting accepts: the rule of each Settings field (a test of a value of the right type, and what is
accepted, for config's error messages) and the engine limits the rules name. Reads no environment (config does)."""
from __future__ import annotations

from typing import Any, Callable

from .config_values import no_nul

BACKENDS = ("null", "cpu", "cuda")
NCCL_STEPS = 8                       # FIFO slots per connection, as NCCL_STEPS
MAXCHANNELS = 64
FLIGHTREC_DUMPS = ("failure", "always")     # when the flight recorder writes its trace
LOG_LEVELS = ("WARN", "INFO", "DEBUG", "WARNING", "ERROR", "CRITICAL")   # ours, and Python's logging's names
MAX_SECONDS = 86400.0                # any time setting: a day at most (an infinite wait would hang)
MAX_RING_SLOTS = 1 << 24             # 1.5 GiB of stamps per channel; more fails later as a bare OSError
MAX_CPU_POOL = 1 << 36               # 64 GiB of registered memory per rank
MAX_BUFFSIZE = 1 << 30               # NCCL's is a few MiB: more is a typo (huge values overflowed os.ftruncate)


def _secs(v: float) -> bool:
    return 0 < v <= MAX_SECONDS            # nan and inf fail too: an endless wait would hang


_SECS = f"> 0 seconds and <= {MAX_SECONDS:.0f}"
# field -> (test of a value of the right type, what is accepted); "one of" rules say "is not one of"
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "backend": (lambda v: v in BACKENDS, f"one of {BACKENDS}"),
    "nchannels": (lambda v: 0 <= v <= MAXCHANNELS, f"in 0..{MAXCHANNELS} (0 = backend default)"),
    "buffsize": (lambda v: NCCL_STEPS * 4096 <= v <= MAX_BUFFSIZE and v % (NCCL_STEPS * 512) == 0,
                 f">= {NCCL_STEPS * 4096} and a multiple of {NCCL_STEPS * 512} "
                 f"(8 FIFO steps of whole 512-byte grains), <= {MAX_BUFFSIZE} (1G)"),
    "p2p_chunksize": (lambda v: v >= 4096 and v % 512 == 0, "a multiple of 512, >= 4096"),
    "nthreads": (lambda v: v in (64, 128, 256, 512, 640), "one of (64, 128, 256, 512, 640)"),
    "timeout_s": (_secs, _SECS),
    "ring_slots": (lambda v: 64 <= v <= MAX_RING_SLOTS and not v & (v - 1),
                   f"a power of two in 64..{MAX_RING_SLOTS} (2**24)"),
    "sample_rate": (lambda v: 1 <= v <= 255, "in 1..255 (1 keeps every slice)"),
    "op_sample_rate": (lambda v: 1 <= v <= 1_000_000, "in 1..1000000 (1 profiles every op)"),
    "profile_min_bytes": (lambda v: v >= 0, ">= 0 bytes (0 profiles every size)"),
    "drain_interval_us": (lambda v: 10 <= v <= 1_000_000, "in 10..1000000"),
    "profile_event_mask": (lambda v: 0 <= v < 1 << 32, "in 0..2**32-1"),
    "plugin_max_failures": (lambda v: v >= 1, ">= 1"),
    "profile_dump_file": (no_nul, "a path prefix without a NUL byte"),
    "linkstats_file": (no_nul, "a path prefix without a NUL byte"),
    "cache_dir": (no_nul, "a folder path without a NUL byte"),
    # '' is no folder (the variable's is unset, as NCCL's): not a silent default folder
    "inspector_dump_dir": (lambda v: no_nul(v) and bool(v.strip()), "a folder path without a NUL byte, not empty "
                           "('.': the working directory; None: NCCL's default, nccl-inspector-<SLURM_JOBID>)"),
    "inspector_dump_interval_us": (lambda v: 0 <= v <= MAX_SECONDS * 1e6, f"in 0..{MAX_SECONDS * 1e6:.0f} microseconds "
                                   f"(0 = every collective)"),
    "linkstats_interval_s": (_secs, _SECS),
    "clock_resync_s": (_secs, _SECS),
    "cpu_reclaim": (lambda v: v in ("auto", "on", "off"), "one of ('auto', 'on', 'off')"),
    "cpu_pool": (lambda v: 0 <= v <= MAX_CPU_POOL, f"in 0..{MAX_CPU_POOL} bytes (64G; 0 = no registered memory)"),
    "cpu_wait": (lambda v: v in ("auto", "futex", "spin"), "one of ('auto', 'futex', 'spin')"),
    "cpu_bind": (lambda v: v in ("auto", "on", "off"), "one of ('auto', 'on', 'off')"),
    "flightrec_ops": (lambda v: v >= 1, ">= 1 (completed ops kept per communicator)"),
    "flightrec_max_records": (lambda v: v >= 1, ">= 1 (KernelCh and KernelStep records kept per communicator)"),
    "flightrec_dump": (lambda v: v in FLIGHTREC_DUMPS, f"one of {FLIGHTREC_DUMPS}"),
    "flightrec_file": (lambda v: no_nul(v) and bool(v.strip()), "a path prefix without a NUL byte, not empty"),
    "debug": (lambda v: v.upper() in LOG_LEVELS, f"one of {LOG_LEVELS} (any case)"),
}
