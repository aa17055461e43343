"""The only module that reads os.environ.

`Settings.from_env()` builds one frozen Settings; explicit keyword arguments beat the environment.
`VARIABLES` is the single table of every SLICETRACE_* variable (the README and `slicetrace config` print it).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Mapping

from .errors import ConfigError

BACKENDS = ("null", "cpu", "cuda")
NCCL_STEPS = 8                       # FIFO slots per connection, as NCCL_STEPS
MAXCHANNELS = 64
POOL_NAMES = ("GROUP_API", "COLL_API", "P2P_API", "KERNEL_LAUNCH", "GROUP", "COLL", "P2P",
              "KERNEL_CH", "KERNEL_STEP", "PROXY_CTRL")
# Events *in flight* per type (slots retire on completion). Sized for a drain that lags a few thousand ops
# behind an asynchronous GPU stream (seen: 256 Colls in flight on a 1 MiB all_reduce loop).
DEFAULT_POOL_SIZES = {"GROUP_API": 4096, "COLL_API": 4096, "P2P_API": 4096, "KERNEL_LAUNCH": 4096,
                      "GROUP": 4096, "COLL": 4096, "P2P": 16384, "KERNEL_CH": 65536,
                      "KERNEL_STEP": 1 << 20, "PROXY_CTRL": 16}


def _bool(v: str) -> bool:
    if v.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if v.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected 0/1/true/false")


def _int(v: str) -> int:
    return int(v, 0)


def _bytes(v: str) -> int:
    """An integer, or one with a binary suffix K, M or G (64K = 65536), as the bench's -b/-e take."""
    t = v.strip().upper()
    if not t.startswith("0X"):               # hex digits include B
        for i, suffix in enumerate("KMG"):
            if t.endswith((suffix, suffix + "B")):
                return int(t[:t.rindex(suffix)]) << (10 * (i + 1))
    return int(t, 0)


def _opt_str(v: str) -> str | None:
    return v or None


@dataclass(frozen=True)
class Var:
    name: str          # environment variable
    attr: str          # Settings field
    parse: Callable[[str], Any]
    doc: str


VARIABLES: tuple[Var, ...] = (
    Var("SLICETRACE_BACKEND", "backend", str, "engine backend: cpu (default), cuda, or null (tests)"),
    Var("SLICETRACE_NCHANNELS", "nchannels", _int, "channels per collective; 0 = backend default (cpu 1; cuda picks by size as NCCL does, up to 64)"),
    Var("SLICETRACE_BUFFSIZE", "buffsize", _int, "Simple-protocol FIFO bytes per connection (NCCL_BUFFSIZE), default 4194304"),
    Var("SLICETRACE_P2P_CHUNKSIZE", "p2p_chunksize", _int, "send/recv chunk bytes (NCCL_P2P_NVL_CHUNKSIZE), default 524288"),
    Var("SLICETRACE_NTHREADS", "nthreads", _int, "CUDA threads per block (NCCL_NTHREADS), default 512"),
    Var("SLICETRACE_TIMEOUT", "timeout_s", float, "seconds any wait may take before it becomes an error, default 60"),
    Var("SLICETRACE_STAMP_RING_SLOTS", "ring_slots", _int, "entries in each started/completed stamp ring per channel (power of two), default 16384"),
    Var("SLICETRACE_KERNEL_STEP_SAMPLE_RATE", "sample_rate", _int, "keep slice 0 and every k-th slice of each work (1..255), default 1"),
    Var("SLICETRACE_PROFILE_OP_SAMPLE_RATE", "op_sample_rate", _int, "profile the first op and every k-th op of a communicator (1..1000000, default 1 = every op); the others run unprofiled and are counted (ops_sampled_out)"),
    Var("SLICETRACE_PROFILE_MIN_BYTES", "profile_min_bytes", _bytes, "bytes, e.g. 65536 or 64K: ops smaller than this (count x element size, as NCCL counts) run unprofiled and are counted (ops_below_min_bytes); default 0"),
    Var("SLICETRACE_DRAIN_INTERVAL_US", "drain_interval_us", _int, "drain thread poll period in microseconds, cuda backend (adaptive, backs off to 16 ms; the cpu backend drains inline between ops), default 500"),
    Var("SLICETRACE_PROFILER_PLUGIN", "profiler_plugin", _opt_str, "plugins: 'example', 'linkstats', 'module:attr', an entry point in group slicetrace.profilers, comma-separated for several, 'none' to disable"),
    Var("SLICETRACE_PROFILE_EVENT_MASK", "profile_event_mask", _int, "event mask the example plugin asks for; default Coll|P2p|KernelCh|KernelStep = 65606"),
    Var("SLICETRACE_PROFILE_DUMP_FILE", "profile_dump_file", _opt_str, "example plugin: trace path prefix, files are <prefix>_<commHash>_<rank>.json"),
    Var("SLICETRACE_LINKSTATS_FILE", "linkstats_file", _opt_str, "linkstats plugin: Prometheus text file prefix, files are <prefix>_<commHash>_<rank>.prom (node_exporter textfile collector); unset = no file"),
    Var("SLICETRACE_LINKSTATS_INTERVAL_S", "linkstats_interval_s", float, "linkstats plugin: seconds between rewrites of its .prom file while ops run (and once at close), default 10"),
    Var("SLICETRACE_PLUGIN_MAX_FAILURES", "plugin_max_failures", _int, "plugin exceptions before that plugin is disabled, default 16"),
    Var("SLICETRACE_CPU_RECLAIM", "cpu_reclaim", str, "cpu: after reading a FIFO slot the receiver stores once per cache line so the sender's next write does not stall on lines shared across L3 caches: auto (default: measured per connection), on, off"),
    Var("SLICETRACE_CPU_WAIT", "cpu_wait", str, "cpu: how a rank waits for its ring neighbour: auto (default: sleep in the kernel (futex) when ranks outnumber this process's CPUs, else spin then yield), futex, spin"),
    Var("SLICETRACE_CPU_BIND", "cpu_bind", str, "cpu: bind the thread that runs a communicator's ops to a CPU of its own while it is open, when every rank can have one and runs one channel (as mpirun binds to cores): auto (default: in the rank processes slicetrace.launch and the CLI start, when they fill more than half of the CPUs; not in processes started otherwise, whose later threads and children would inherit it), on, off"),
    Var("SLICETRACE_CACHE_DIR", "cache_dir", str, "compiled-kernel cache folder, default ~/.cache/slicetrace"),
    Var("SLICETRACE_ASSERT_WARM", "assert_warm", _bool, "1 = a kernel compile during timed work is an error"),
    Var("SLICETRACE_CLOCK_RESYNC_S", "clock_resync_s", float, "cuda: seconds between GPU/host clock offset re-measurements, default 1.0"),
    Var("SLICETRACE_DEBUG", "debug", str, "log level: WARN (default), INFO, DEBUG"),
)
POOL_VARIABLES = tuple(f"SLICETRACE_PROFILE_{n}_POOL_SIZE" for n in POOL_NAMES)
DIST_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Settings:
    backend: str = "cpu"
    nchannels: int = 0
    buffsize: int = 1 << 22
    p2p_chunksize: int = 1 << 19
    nthreads: int = 512
    timeout_s: float = 60.0
    ring_slots: int = 16384
    sample_rate: int = 1
    op_sample_rate: int = 1
    profile_min_bytes: int = 0
    drain_interval_us: int = 500
    profiler_plugin: str | None = None
    profile_event_mask: int | None = None
    profile_dump_file: str | None = None
    pool_sizes: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_POOL_SIZES))
    plugin_max_failures: int = 16
    linkstats_file: str | None = None
    linkstats_interval_s: float = 10.0
    cpu_reclaim: str = "auto"
    cpu_wait: str = "auto"
    cpu_bind: str = "auto"
    cache_dir: str = os.path.join(os.path.expanduser("~"), ".cache", "slicetrace")
    assert_warm: bool = False
    clock_resync_s: float = 1.0
    debug: str = "WARN"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend={self.backend!r} is not one of {BACKENDS}")
        if not 0 <= self.nchannels <= MAXCHANNELS:
            raise ConfigError(f"nchannels={self.nchannels} must be in 0..{MAXCHANNELS} (0 = backend default)")
        if self.buffsize < NCCL_STEPS * 4096 or self.buffsize % (NCCL_STEPS * 512):
            raise ConfigError(f"buffsize={self.buffsize} must be >= {NCCL_STEPS * 4096} and a multiple of "
                              f"{NCCL_STEPS * 512} (8 FIFO steps of whole 512-byte grains)")
        if self.p2p_chunksize < 4096 or self.p2p_chunksize % 512:
            raise ConfigError(f"p2p_chunksize={self.p2p_chunksize} must be a multiple of 512, >= 4096")
        if self.nthreads not in (64, 128, 256, 512, 640):
            raise ConfigError(f"nthreads={self.nthreads} is not one of (64, 128, 256, 512, 640)")
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s={self.timeout_s} must be > 0")
        if self.ring_slots < 64 or self.ring_slots & (self.ring_slots - 1):
            raise ConfigError(f"ring_slots={self.ring_slots} must be a power of two >= 64")
        if not 1 <= self.sample_rate <= 255:
            raise ConfigError(f"sample_rate={self.sample_rate} must be in 1..255 (1 keeps every slice)")
        if not 1 <= self.op_sample_rate <= 1_000_000:
            raise ConfigError(f"op_sample_rate={self.op_sample_rate} must be in 1..1000000 (1 profiles every op)")
        if self.profile_min_bytes < 0:
            raise ConfigError(f"profile_min_bytes={self.profile_min_bytes} must be >= 0 bytes (0 profiles every size)")
        if not 10 <= self.drain_interval_us <= 1_000_000:
            raise ConfigError(f"drain_interval_us={self.drain_interval_us} must be in 10..1000000")
        if self.profile_event_mask is not None and not 0 <= self.profile_event_mask < (1 << 32):
            raise ConfigError(f"profile_event_mask={self.profile_event_mask} must be in 0..2**32-1")
        for name, size in self.pool_sizes.items():
            if name not in POOL_NAMES:
                raise ConfigError(f"pool {name!r} is not one of {POOL_NAMES}")
            if size < 1:
                raise ConfigError(f"SLICETRACE_PROFILE_{name}_POOL_SIZE={size} must be >= 1")
        if not self.linkstats_interval_s > 0:
            raise ConfigError(f"linkstats_interval_s={self.linkstats_interval_s} must be > 0 seconds")
        if self.plugin_max_failures < 1:
            raise ConfigError(f"plugin_max_failures={self.plugin_max_failures} must be >= 1")
        if self.cpu_reclaim not in ("auto", "on", "off"):
            raise ConfigError(f"cpu_reclaim={self.cpu_reclaim!r} is not one of ('auto', 'on', 'off')")
        if self.cpu_wait not in ("auto", "futex", "spin"):
            raise ConfigError(f"cpu_wait={self.cpu_wait!r} is not one of ('auto', 'futex', 'spin')")
        if self.cpu_bind not in ("auto", "on", "off"):
            raise ConfigError(f"cpu_bind={self.cpu_bind!r} is not one of ('auto', 'on', 'off')")
        if self.debug.upper() not in ("WARN", "INFO", "DEBUG"):
            raise ConfigError(f"debug={self.debug!r} is not one of ('WARN', 'INFO', 'DEBUG')")

    @property
    def step_bytes(self) -> int:
        return self.buffsize // NCCL_STEPS

    @property
    def p2p_chunk_bytes(self) -> int:
        return min(self.p2p_chunksize, self.step_bytes)     # a chunk must fit one FIFO step

    @property
    def channels(self) -> int:
        """Channels for backends that do not choose by size (cpu, null); cuda picks per op, as NCCL does."""
        return self.nchannels or 1

    def with_(self, **kw: Any) -> "Settings":
        return replace(self, **kw)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        env = os.environ if env is None else env
        vals: dict[str, Any] = {}
        for var in VARIABLES:
            raw = env.get(var.name)
            if raw is None:
                continue
            try:
                vals[var.attr] = var.parse(raw)
            except ValueError:
                raise ConfigError(f"{var.name}={raw!r} cannot be parsed: {var.doc}") from None
        pools = dict(DEFAULT_POOL_SIZES)
        for name, var in zip(POOL_NAMES, POOL_VARIABLES):
            if var in env:
                try:
                    pools[name] = int(env[var], 0)
                except ValueError:
                    raise ConfigError(f"{var}={env[var]!r} must be an integer >= 1") from None
        vals["pool_sizes"] = pools
        overrides = {k: v for k, v in overrides.items() if v is not None}
        known = {f.name for f in fields(cls)}
        bad = sorted(set(overrides) - known)
        if bad:
            raise ConfigError(f"unknown setting(s) {bad}; known: {sorted(known)}")
        try:
            return cls(**{**vals, **overrides})
        except ConfigError as e:            # name the variable the bad value came from
            attr = str(e).split("=", 1)[0]
            var = next((v.name for v in VARIABLES if v.attr == attr and attr in vals and attr not in overrides), None)
            if var is None:
                raise
            raise ConfigError(f"{var}={env[var]!r}: {e}") from None


@dataclass(frozen=True)
class DistEnv:
    """torchrun's variables, when present."""
    rank: int | None
    world_size: int | None
    local_rank: int | None
    master_addr: str | None
    master_port: int | None


def dist_env(env: Mapping[str, str] | None = None) -> DistEnv:
    env = os.environ if env is None else env

    def num(name: str) -> int | None:
        if name not in env:
            return None
        try:
            return int(env[name])
        except ValueError:
            raise ConfigError(f"{name}={env[name]!r} must be an integer") from None
    return DistEnv(num("RANK"), num("WORLD_SIZE"), num("LOCAL_RANK"), env.get("MASTER_ADDR"), num("MASTER_PORT"))


def describe(settings: Settings, env: Mapping[str, str] | None = None) -> list[tuple[str, str, str, str]]:
    """(variable, effective value, raw env value or 'unset', doc) for `slicetrace config`."""
    env = os.environ if env is None else env
    rows = [(v.name, repr(getattr(settings, v.attr)), env.get(v.name, "unset"), v.doc) for v in VARIABLES]
    for name, var in zip(POOL_NAMES, POOL_VARIABLES):
        rows.append((var, str(settings.pool_sizes[name]), env.get(var, "unset"),
                     f"example plugin pool size for {name} events"))
    return rows
