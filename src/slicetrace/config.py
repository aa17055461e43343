"""The only module that reads os.environ.

`Settings.from_env()` builds one frozen Settings; explicit keyword arguments beat the environment.
`VARIABLES` is the single table of every SLICETRACE_* variable (`slicetrace config` prints it; the README's
table is written by hand: change both together). The parsers of a variable's text are config_values', the rules
of what each setting accepts config_rules'.
"""
from __future__ import annotations

import logging
import os
import re
import tempfile
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Mapping

from .config_rules import NCCL_STEPS, RULES
from .config_values import FORMATS, TYPES, as_bool, as_bytes, as_int, as_mask, as_seconds, is_int, plugin_spec
from .errors import ConfigError, closest
from .events.abi import parse_mask

log = logging.getLogger("slicetrace")
POOL_NAMES = ("GROUP_API", "COLL_API", "P2P_API", "KERNEL_LAUNCH", "GROUP", "COLL", "P2P",
              "KERNEL_CH", "KERNEL_STEP", "PROXY_CTRL")
# Events *in flight* per type (slots retire on completion). Sized for a drain that lags a few thousand ops
# behind an asynchronous GPU stream (seen: 256 Colls in flight on a 1 MiB all_reduce loop). PROXY_CTRL: the last
# drain-state spans kept (NCCL's example keeps 16 events: a few polls, too few to see the drain's run).
DEFAULT_POOL_SIZES = {"GROUP_API": 4096, "COLL_API": 4096, "P2P_API": 4096, "KERNEL_LAUNCH": 4096,
                      "GROUP": 4096, "COLL": 4096, "P2P": 16384, "KERNEL_CH": 65536,
                      "KERNEL_STEP": 1 << 20, "PROXY_CTRL": 4096}
DEFAULT_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "slicetrace")


@dataclass(frozen=True)
class Var:
    name: str          # environment variable
    attr: str          # Settings field
    parse: Callable[[str], Any]
    doc: str


VARIABLES: tuple[Var, ...] = (
    Var("SLICETRACE_BACKEND", "backend", str, "engine backend: cpu (default), cuda, or null (tests)"),
    Var("SLICETRACE_NCHANNELS", "nchannels", as_int, "channels per collective; 0 = backend default (cpu 1; cuda picks by size as NCCL does, up to 64 with up to 4 ranks, 32 with more)"),
    Var("SLICETRACE_BUFFSIZE", "buffsize", as_bytes, "Simple-protocol FIFO bytes per connection (NCCL_BUFFSIZE), e.g. 4194304 or 4M (>= 32768, a multiple of 4096, <= 1G), default 4M; on cpu each rank reserves about (nchannels + world) x buffsize in /dev/shm"),
    Var("SLICETRACE_P2P_CHUNKSIZE", "p2p_chunksize", as_bytes, "send/recv chunk bytes (NCCL_P2P_NVL_CHUNKSIZE), e.g. 524288 or 512K (>= 4096, a multiple of 512; capped at BUFFSIZE/8), default 512K"),
    Var("SLICETRACE_NTHREADS", "nthreads", as_int, "CUDA threads per block (NCCL_NTHREADS): 64, 128, 256, 512 or 640, default 512"),
    Var("SLICETRACE_TIMEOUT", "timeout_s", as_seconds, "seconds any wait may take before it becomes an error, the ranks' start-up included (> 0, <= 86400; bench: >= 1), default 60"),
    Var("SLICETRACE_STAMP_RING_SLOTS", "ring_slots", as_int, "entries in each stamp ring of a channel (a power of two in 64..16777216), default 16384"),
    Var("SLICETRACE_KERNEL_STEP_SAMPLE_RATE", "sample_rate", as_int, "keep slice 0 and every k-th slice of each channel program and direction (1..255; both ends of a connection keep the same slices), default 1"),
    Var("SLICETRACE_PROFILE_OP_SAMPLE_RATE", "op_sample_rate", as_int, "profile the first op and every k-th op of a communicator, collectives and point-to-point groups counted apart (1..1000000, default 1 = every op); the others run unprofiled and are counted (ops_sampled_out)"),
    Var("SLICETRACE_PROFILE_MIN_BYTES", "profile_min_bytes", as_bytes, "bytes, e.g. 65536 or 64K: ops smaller than this (count x element size, as NCCL counts) run unprofiled and are counted (ops_below_min_bytes); default 0"),
    Var("SLICETRACE_DRAIN_INTERVAL_US", "drain_interval_us", as_int, "drain thread poll period in microseconds (10..1000000), cuda backend (adaptive, backs off to 16 ms; the cpu backend drains inline between ops), default 500"),
    Var("SLICETRACE_PROFILER_PLUGIN", "profiler_plugin", str, "plugins: 'example', 'linkstats', 'inspector', 'flightrec', 'module:attr', an entry point in group slicetrace.profilers, comma-separated for several, 'none' (any case) to disable"),
    Var("SLICETRACE_PROFILE_EVENT_MASK", "profile_event_mask", as_mask, "event mask the example plugin asks for: an integer in 0..2**32-1 or event type names, e.g. 65606 = 0x10046 = Coll|P2p|KernelCh|KernelStep (its default)"),
    Var("SLICETRACE_PROFILE_DUMP_FILE", "profile_dump_file", str, "example plugin: trace path prefix, files are <prefix>_<commHash>_<rank>.json"),
    Var("SLICETRACE_LINKSTATS_FILE", "linkstats_file", str, "linkstats plugin: Prometheus text file prefix, files are <prefix>_<commHash>_<rank>.prom (node_exporter textfile collector); unset = no file"),
    Var("SLICETRACE_LINKSTATS_INTERVAL_S", "linkstats_interval_s", as_seconds, "linkstats plugin: seconds between rewrites of its .prom file while ops run (and once at close) (> 0, <= 86400), default 10"),
    Var("SLICETRACE_INSPECTOR_DUMP_DIR", "inspector_dump_dir", str, "inspector plugin: folder of its JSON-lines files, <hostname>-pid<pid>.log; unset = nccl-inspector-<SLURM_JOBID> (nccl-inspector-unknown-jobid outside Slurm), as NCCL's Inspector"),
    Var("SLICETRACE_INSPECTOR_DUMP_INTERVAL_US", "inspector_dump_interval_us", as_int, "inspector plugin: 0 (default) = a line per collective; > 0 = as NCCL's Inspector, per communicator the latest completed collective at most once per this many microseconds (and the last at close), <= 86400000000"),
    Var("SLICETRACE_INSPECTOR_VERBOSE", "inspector_verbose", as_bool, "inspector plugin: 1 = add event_trace_sn and event_trace_ts (per-channel kernel events) to each line (0/1/true/false/yes/no/on/off), default off"),
    Var("SLICETRACE_FLIGHTREC_OPS", "flightrec_ops", as_int, "flightrec plugin: completed Coll/P2p ops kept per communicator, with their KernelCh and KernelStep records (every op still in flight is kept too) (>= 1), default 32"),
    Var("SLICETRACE_FLIGHTREC_MAX_RECORDS", "flightrec_max_records", as_int, "flightrec plugin: most KernelCh and KernelStep records kept per communicator; past it the oldest ops go first (counted in the dump) (>= 1), default 1000000"),
    Var("SLICETRACE_FLIGHTREC_DUMP", "flightrec_dump", str, "flightrec plugin: when it writes its trace: failure (default: an op failed, or an op was unfinished at close), always (also at every close)"),
    Var("SLICETRACE_FLIGHTREC_FILE", "flightrec_file", str, "flightrec plugin: trace path prefix, files are <prefix>_<commHash>_<rank>.json (the example plugin's names), default flightrec (in the working directory)"),
    Var("SLICETRACE_PLUGIN_MAX_FAILURES", "plugin_max_failures", as_int, "plugin exceptions before that plugin is disabled (>= 1), default 16"),
    Var("SLICETRACE_CPU_RECLAIM", "cpu_reclaim", str, "cpu: after reading a FIFO slot the receiver stores once per cache line so the sender's next write does not stall on lines shared across L3 caches: auto (default: measured per connection), on, off"),
    Var("SLICETRACE_CPU_POOL", "cpu_pool", as_bytes, "cpu: bytes of registered memory each rank reserves in /dev/shm for Comm.mem_alloc (as ncclMemAlloc + ncclCommRegister): ring collectives on buffers from it read and write the peer's buffer directly instead of through the FIFO (fewer copies), and mem_alloc(..., symmetric=True) windows run the symmetric kernels; e.g. 256M, <= 64G, default 0 (none)"),
    Var("SLICETRACE_CPU_WAIT", "cpu_wait", str, "cpu: how a rank waits for its ring neighbour: auto (default: sleep in the kernel (futex) when ranks outnumber this process's CPUs, else spin then yield), futex, spin"),
    Var("SLICETRACE_CPU_BIND", "cpu_bind", str, "cpu: bind the thread that runs a communicator's ops to a CPU of its own while it is open, when every rank can have one and runs one channel (as mpirun binds to cores): auto (default: in the rank processes slicetrace.launch and the CLI start, when they fill more than half of the CPUs; not in processes started otherwise, whose later threads and children would inherit it), on, off"),
    Var("SLICETRACE_CACHE_DIR", "cache_dir", str, "compiled-kernel cache folder, default ~/.cache/slicetrace"),
    Var("SLICETRACE_ASSERT_WARM", "assert_warm", as_bool, "1 = a kernel compile during timed work is an error (0/1/true/false/yes/no/on/off), default off"),
    Var("SLICETRACE_CLOCK_RESYNC_S", "clock_resync_s", as_seconds, "cuda: seconds between GPU/host clock offset re-measurements (> 0, <= 86400), default 1.0"),
    Var("SLICETRACE_DEBUG", "debug", str, "log level: WARN (default), INFO, DEBUG, or Python's level names (WARNING, ERROR, CRITICAL), any case"),
)
POOL_VARIABLES = tuple(f"SLICETRACE_PROFILE_{n}_POOL_SIZE" for n in POOL_NAMES)
DIST_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
                  "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")
_warned: set[tuple[str, str]] = set()      # unknown variables already reported by this process


_WORDS = ("backend", "cpu_reclaim", "cpu_wait", "cpu_bind", "flightrec_dump")     # settings that are one of a few lowercase words


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
    inspector_dump_dir: str | None = None
    inspector_dump_interval_us: int = 0
    inspector_verbose: bool = False
    flightrec_ops: int = 32
    flightrec_max_records: int = 1_000_000
    flightrec_dump: str = "failure"
    flightrec_file: str = "flightrec"
    cpu_reclaim: str = "auto"
    cpu_pool: int = 0
    cpu_wait: str = "auto"
    cpu_bind: str = "auto"
    cache_dir: str = DEFAULT_CACHE_DIR
    assert_warm: bool = False
    clock_resync_s: float = 1.0
    debug: str = "WARN"

    def __new__(cls, *args: Any, **kw: Any) -> "Settings":
        _refuse_unknown(kw)         # before dataclasses' __init__, whose error was a bare TypeError
        if len(args) > len(fields(cls)):
            raise ConfigError(f"Settings takes at most {len(fields(cls))} positional arguments (its fields in "
                              f"order), got {len(args)}; pass settings by keyword")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for name in _WORDS:                 # any case, from a keyword as from the environment
            v = getattr(self, name)
            if isinstance(v, str) and v != v.strip().lower():
                object.__setattr__(self, name, v.strip().lower())
        object.__setattr__(self, "profiler_plugin", plugin_spec(self.profiler_plugin))  # a class: 'module:qualname'
        if isinstance(self.cache_dir, str) and not self.cache_dir.strip():    # as the variable's: '' put kernels in
            object.__setattr__(self, "cache_dir", DEFAULT_CACHE_DIR)          # the working directory
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "pool_sizes":
                self._check_pools(v)
                continue
            is_type, want = TYPES[f.type]
            ok, accepted = RULES.get(f.name, (None, ""))
            if not is_type(v):
                raise ConfigError(f"{f.name}={v!r} (type {type(v).__name__}) is not accepted: {f.name} must be "
                                  f"{want}" + (f", {accepted}" if accepted else ""))
            if ok is not None and v is not None and not ok(v):
                verb = "is not" if accepted.startswith("one of") else "must be"
                raise ConfigError(f"{f.name}={v!r} {verb} {accepted}")

    @staticmethod
    def _check_pools(pools: Any) -> None:
        if not isinstance(pools, Mapping):
            raise ConfigError(f"pool_sizes={pools!r} (type {type(pools).__name__}) is not accepted: pool_sizes must "
                              f"be a dict of pool name -> int >= 1; names: {', '.join(POOL_NAMES)}")
        for name, size in pools.items():
            if name not in POOL_NAMES:
                raise ConfigError(f"pool_sizes: pool {name!r} is not one of {POOL_NAMES}")
            if not is_int(size) or size < 1:
                raise ConfigError(f"pool_sizes[{name!r}]={size!r} must be an int >= 1 "
                                  f"(as SLICETRACE_PROFILE_{name}_POOL_SIZE)")

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
        """A copy with the given fields changed; an unknown name is a ConfigError, as Settings()'s."""
        return replace(self, **kw)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        env = os.environ if env is None else env
        _warn_unknown(env)
        vals: dict[str, Any] = {}
        for var in VARIABLES:
            raw = _value(env, var.name)
            if raw is None or overrides.get(var.attr) is not None:    # an argument (a CLI flag) wins, unparsed
                continue
            try:
                vals[var.attr] = var.parse(raw)
            except ValueError as e:             # the reason (an unknown event type, a leading zero), the range
                why = f" ({e})" if var.parse in (as_mask, as_int) else ""
                rule = RULES.get(var.attr)
                raise ConfigError(f"{var.name}={raw!r} cannot be parsed{why}: expected {FORMATS[var.parse]}"
                                  + (f", {rule[1]}" if rule else "")) from None
        pools = dict(DEFAULT_POOL_SIZES)
        for name, var in zip(POOL_NAMES, POOL_VARIABLES):
            if _value(env, var) is not None and overrides.get("pool_sizes") is None:   # the keyword: all of them
                try:
                    pools[name] = as_int(env[var])
                except ValueError:
                    pools[name] = 0
                if pools[name] < 1:
                    raise ConfigError(f"{var}={env[var]!r} must be an integer >= 1 (decimal or 0x hex)")
        vals["pool_sizes"] = pools
        _refuse_unknown(overrides)                  # None too: nchanels=None was a misspelling let through
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if isinstance(overrides.get("profile_event_mask"), str):     # type names, as the variable takes
            try:
                overrides["profile_event_mask"] = parse_mask(overrides["profile_event_mask"])
            except ValueError as e:
                raise ConfigError(f"profile_event_mask={overrides['profile_event_mask']!r}: {e}; expected "
                                  f"{FORMATS[as_mask]}") from None
        try:
            return cls(**{**vals, **overrides})
        except ConfigError as e:            # name the variable the bad value came from
            attr = str(e).split("=", 1)[0]
            var = next((v.name for v in VARIABLES if v.attr == attr and attr in vals and attr not in overrides), None)
            if var is None:
                raise
            raise ConfigError(f"{var}={env[var]!r}: {e}") from None


def _value(env: Mapping[str, str], name: str) -> str | None:
    """A SLICETRACE_* variable's text; empty or blank counts as unset (`X= cmd`, `${X:-}` in a script), as NCCL's
    getenv checks have it: the one rule for every variable."""
    raw = env.get(name)
    return raw if raw is not None and raw.strip() else None


def inspector_dir(settings: Settings, env: Mapping[str, str] | None = None) -> str:
    """The inspector plugin's folder: inspector_dump_dir, else NCCL's Inspector default, nccl-inspector-<SLURM_JOBID>
    (nccl-inspector-unknown-jobid without one)."""
    if settings.inspector_dump_dir:
        return settings.inspector_dump_dir
    job = (os.environ if env is None else env).get("SLURM_JOBID", "").strip()
    return f"nccl-inspector-{job or 'unknown-jobid'}"


def inspector_dir_named(settings: Settings, env: Mapping[str, str] | None = None) -> str:
    """The inspector's folder as an error names it: its variable or keyword with the value, or its default's."""
    folder = inspector_dir(settings, env)
    if settings.inspector_dump_dir:
        return f"{value_source('inspector_dump_dir', folder, env)}={folder!r}"
    return f"inspector_dump_dir (SLICETRACE_INSPECTOR_DUMP_DIR) unset: its default folder {folder!r}"


def temp_dir() -> str:
    """TMPDIR's folder, as tempfile reads it: the cpu backend's core locks, bench --compare's store file."""
    return tempfile.gettempdir()


def unwritable(folder: str) -> tuple[str, str] | None:
    """(the folder probed, why no file can be written there), or None: a real file is made and removed (os.access
    says yes to root everywhere, /proc included) in `folder`, or where it does not exist yet (the plugins make it),
    in the nearest folder above it."""
    d = os.path.abspath(folder)
    while not os.path.lexists(d):
        d = os.path.dirname(d)
    try:
        fd, probe = tempfile.mkstemp(dir=d, prefix=".slicetrace_probe_")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        return d, e.strerror or str(e)
    return None


def env_source(attr: str, env: Mapping[str, str] | None = None) -> str | None:
    """The SLICETRACE_* variable that sets Settings field `attr`, when the environment sets it: an error about a
    value names where it came from."""
    env = os.environ if env is None else env
    return next((v.name for v in VARIABLES if v.attr == attr and _value(env, v.name) is not None), None)


def value_source(attr: str, value: Any, env: Mapping[str, str] | None = None) -> str:
    """For an error about Settings field `attr`: its SLICETRACE_* variable when that holds `value`, else the keyword."""
    env = os.environ if env is None else env
    var = next((v for v in VARIABLES if v.attr == attr and v.name in env), None)
    try:
        return var.name if var is not None and var.parse(env[var.name]) == value else attr
    except ValueError:                      # a bad variable the keyword beat: not where this came from
        return attr


def quiet_unknown(env: Mapping[str, str] | None = None) -> None:
    """Take the unknown variables as reported: a rank of launch() inherits its launcher's environment, which the
    launcher already warned about (one warning per run, not one per rank)."""
    env = os.environ if env is None else env
    _warned.update((k, v) for k, v in env.items() if k.startswith("SLICETRACE_"))


def _warn_unknown(env: Mapping[str, str]) -> None:
    """A misspelled variable would silently do nothing; warn, not raise: other tools may share the prefix."""
    known = [v.name for v in VARIABLES] + list(POOL_VARIABLES)
    n = len("SLICETRACE_")
    for name in sorted(k for k in env if k.startswith("SLICETRACE_") and k not in known):
        if (name, env[name]) in _warned:
            continue
        _warned.add((name, env[name]))
        close = closest(name[n:], [k[n:] for k in known])
        log.warning("slicetrace: %s=%r is not a slicetrace variable and is ignored; %s", name, env[name],
                    f"did you mean SLICETRACE_{close}?" if close else "`slicetrace config` lists them all")


@dataclass(frozen=True)
class DistEnv:
    """torchrun's variables, when present (and asked for)."""
    rank: int | None
    world_size: int | None
    local_rank: int | None
    master_addr: str | None
    master_port: int | None
    agent_store: bool = False       # TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent hosts the TCPStore


def dist_env(env: Mapping[str, str] | None = None, *, ranks: bool = True, master: bool = True) -> DistEnv:
    """torchrun's variables, each checked here so an error names it; only those asked for are read (explicit
    rank/world_size, or a store given, leave them alone). ranks: RANK, WORLD_SIZE and LOCAL_RANK (only checked:
    the cuda backend picks device rank % devices). master: MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE."""
    env = os.environ if env is None else env

    def num(name: str, lo: int, hi: int | None = None, note: str = "") -> int | None:
        if name not in env:
            return None
        accepted = (f"an integer in {lo}..{hi}" if hi is not None else f"an integer >= {lo}") + note
        if not re.fullmatch(r"[0-9]+", env[name]):      # decimal only, as torchrun writes them
            raise ConfigError(f"{name}={env[name]!r} must be {accepted}")
        v = int(env[name])
        if v < lo or (hi is not None and v > hi):
            raise ConfigError(f"{name}={env[name]!r} must be {accepted}")
        return v
    rank = world = local = addr = port = None
    if ranks:
        world = num("WORLD_SIZE", 1)
        rank = num("RANK", 0, None if world is None else world - 1, "" if world is None else f" (WORLD_SIZE={world})")
        local = num("LOCAL_RANK", 0)
    if master:
        addr = env.get("MASTER_ADDR")
        if addr is not None and not addr.strip():
            raise ConfigError(f"MASTER_ADDR={addr!r} must be the host name or IP address of rank 0's host")
        port = num("MASTER_PORT", 1, 65535)         # 0 would let rank 0 pick a port no other rank knows
    # torch's env:// compares with "True" the same way (torch.distributed.rendezvous)
    agent = master and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return DistEnv(rank, world, local, addr, port, agent)


def job_attempt(env: Mapping[str, str] | None = None) -> str:
    """torchrun's run id and restart count as a key part ('' outside torchrun): the workers of a restart meet the
    agent's store again, which still holds the keys of the attempt before."""
    env = os.environ if env is None else env
    run, restart = env.get("TORCHELASTIC_RUN_ID"), env.get("TORCHELASTIC_RESTART_COUNT")
    return "" if run is None and restart is None else f"{run or ''}.{restart or '0'}/"


def job_rank(env: Mapping[str, str] | None = None) -> int | None:
    """torchrun's RANK when it is a plain number, else None (no error: only which process this is)."""
    v = (os.environ if env is None else env).get("RANK", "")
    return int(v) if re.fullmatch(r"[0-9]+", v) else None


def job_world_size(env: Mapping[str, str] | None = None) -> int | None:
    """torchrun's WORLD_SIZE when it is a plain number, else None (no error: only a hint for init())."""
    v = (os.environ if env is None else env).get("WORLD_SIZE", "")
    return int(v) if re.fullmatch(r"[0-9]+", v) else None


def _refuse_unknown(kw: Mapping[str, Any]) -> None:
    """A ConfigError naming keywords that are no Settings field, with the closest and every known name."""
    known = {f.name for f in fields(Settings)}
    bad = sorted(set(kw) - known)
    if bad:
        raise ConfigError(f"unknown setting(s) {bad}{_keyword_hint(bad, known)}; known: {sorted(known)}")


def _keyword_hint(bad: list[str], known: set[str]) -> str:
    """' (did you mean ...)': a keyword spelt as its variable (sample_rate for kernel_step_sample_rate), or close."""
    by_var = {v.name[len("SLICETRACE_"):].lower(): v.attr for v in VARIABLES}
    good = [(b, by_var.get(b.lower()) or closest(b, known)) for b in bad]
    hints = [f"{g} for {b}" for b, g in good if g]
    return f" (did you mean {', '.join(hints)}?)" if hints else ""


def describe(settings: Settings, env: Mapping[str, str] | None = None) -> list[tuple[str, str, str, str, str]]:
    """(variable, init() keyword, effective value, raw env value or 'unset', doc) for `slicetrace config`."""
    env = os.environ if env is None else env
    rows = [(v.name, v.attr, repr(getattr(settings, v.attr)), env.get(v.name, "unset"), v.doc) for v in VARIABLES]
    for name, var in zip(POOL_NAMES, POOL_VARIABLES):
        rows.append((var, "pool_sizes", str(settings.pool_sizes[name]), env.get(var, "unset"),
                     f"example plugin pool size for {name} events"))
    return rows
