"""`slicetrace bench`'s flags checked before any rank starts, and the Settings they make: flags beat SLICETRACE_*
variables, and an error names where its value came from (the flag, or the variable)."""
from __future__ import annotations

import argparse
import importlib.util
import os

from ..backend.base import REDOPS
from ..config import Settings, env_source
from ..config_rules import MAXCHANNELS
from ..errors import ConfigError, SliceTraceError, UsageError
from ..events.abi import ALL_TYPES, EventType
from ..events.loading import BUILTINS, resolve
from .outputs import writable_file
from .sweep import DTYPE_ALIASES, OPS, np_dtype, rank_bytes

KERNEL_STEP = int(EventType.KERNEL_STEP)
# why bench's timeout is at least 1 s, from -T or SLICETRACE_TIMEOUT (init() takes less: its caller's ranks may be up)
_WHY_1S = ("it bounds every wait, the ranks' start-up (rendezvous) included, and ranks start up to seconds apart, so "
          "the run would fail at its first wait")


def parse_ops(text: str) -> list[str]:
    """--op: 'all', or a comma list of OPS, each once."""
    if text == "all":
        return list(OPS)
    ops = [x.strip() for x in text.split(",")]
    if "all" in ops:
        raise SliceTraceError(f"--op {text!r}: 'all' runs every op ({', '.join(OPS)}); give it alone, or list ops")
    bad = [x for x in ops if x not in OPS]
    if bad:                     # nccl-tests' --op is the reduction, -o here
        hint = "; the reduction is -o/--redop (nccl-tests' --op)" if set(bad) & set(REDOPS) else ""
        raise SliceTraceError(f"--op {bad}: each must be one of {OPS} or 'all' (the collectives to run){hint}")
    twice = sorted({x for x in ops if ops.count(x) > 1})
    if twice:                   # it would run (and print) the same sweep again
        raise SliceTraceError(f"--op {text!r} names {', '.join(twice)} more than once; give each op once")
    return ops


def check_flags(a: argparse.Namespace) -> list[str]:
    """The flags that need no settings; returns the ops to run."""
    if a.datatype != "all" and a.datatype not in DTYPE_ALIASES:
        raise SliceTraceError(f"-d {a.datatype!r} is not one of {sorted(DTYPE_ALIASES)} or 'all'")
    ops = parse_ops(a.ops)
    if a.rounds is not None and not a.overhead and not a.compare:     # ignored: say so rather than run without it
        raise SliceTraceError(f"--rounds {a.rounds} counts only with --overhead or --compare (gloo, nccl)")
    for name, v in (("-n", a.iters), ("-w", a.warmup_iters), ("--rounds", 12 if a.rounds is None else a.rounds)):
        if v < (1 if name != "-w" else 0):
            raise SliceTraceError(f"{name} {v} must be >= {1 if name != '-w' else 0}")
    if a.redop not in REDOPS and a.redop != "all":
        raise SliceTraceError(f"-o {a.redop!r} is not one of {REDOPS} or 'all'")
    if a.ranks is not None and a.ranks < 1:
        raise SliceTraceError(f"--ranks {a.ranks} must be >= 1")
    if a.compare == "gloo" and a.ranks == 1 and "send_recv" in ops:     # else torch's RuntimeError in every rank
        raise UsageError(f"--compare gloo --ranks 1 --op {a.ops}: Gloo cannot send to its own rank, which a 1-rank "
                         f"send_recv does; give --ranks 2 or more, or leave send_recv out of --op")
    if a.run_cycles < 0:
        raise SliceTraceError(f"-N {a.run_cycles} must be >= 0 (0: until interrupted)")
    if a.run_cycles == 0 and a.json is not None:
        raise SliceTraceError(f"--json {a.json!r} with -N 0: a run without end never writes it; give -N a count")
    if a.timeout is not None and not a.timeout > 0:
        raise SliceTraceError(f"-T {a.timeout:g} must be > 0 seconds (nccl-tests' -T 0, no timeout, is not offered: "
                              f"every wait here has a timeout)")
    if a.timeout is not None and a.timeout < 1:     # -T 0.001 failed at the rendezvous, naming only timeout_s
        raise UsageError(f"-T {a.timeout:g} must be >= 1 second: {_WHY_1S} (nccl-tests' -T takes whole seconds too)")
    if a.channels is not None and not 0 <= a.channels <= MAXCHANNELS:
        raise UsageError(f"--channels {a.channels} must be in 0..{MAXCHANNELS} (0: the backend chooses)")
    if a.seed < 0:
        raise UsageError(f"--seed {a.seed} must be >= 0 (numpy's generators take no negative seed)")
    if a.json is not None:              # '' too: writable_file refuses it, rather than writing nothing
        writable_file("--json", a.json)
    if a.overhead_of == "kernel_step":
        if not a.overhead:
            raise SliceTraceError("--overhead-of kernel_step needs --overhead")
        if a.profile is not None and a.profile >= 0 and not a.profile & KERNEL_STEP:
            raise SliceTraceError(f"--overhead-of kernel_step: --profile {a.profile} has no KernelStep bit "
                                  f"({KERNEL_STEP}); nothing to compare")
    if a.backend is not None and a.backend not in ("cpu", "cuda"):
        raise UsageError(f"--backend {a.backend!r} is not one of ('cpu', 'cuda')"
                         + (" (null is the tests' backend: it moves no data)" if a.backend == "null" else ""))
    return ops


def timeout_hint(a: argparse.Namespace, e: SliceTraceError) -> str:
    """For a run whose ranks timed out: which limit it was, flag or variable (the ranks' errors name the setting,
    timeout_s), and what to do if the ranks were only slow."""
    if not any(str(v).startswith("CommTimeoutError") for v in (getattr(e, "errors", None) or {}).values()):
        return ""
    var = env_source("timeout_s")
    try:
        secs = Settings.from_env(**({} if a.timeout is None else {"timeout_s": a.timeout})).timeout_s
    except ConfigError:
        return ""
    src = f"-T {secs:g}" if a.timeout is not None else f"{var}={secs:g}" if var else f"the default -T {secs:g}"
    return (f" ({src} s bounds every wait, the ranks' start-up included; if the ranks were only slow, e.g. on a "
            f"loaded machine, give a larger -T)")


def with_example(spec: str | None) -> str:
    """SLICETRACE_PROFILER_PLUGIN with the example plugin in it, which --trace and --profile write through ('none'
    or unset: the example plugin alone; a list without it: the list and it)."""
    items = [x.strip() for x in (spec or "").split(",") if x.strip()]
    if [x.lower() for x in items] in ([], ["none"]):
        return "example"
    chrome = resolve("example")
    if any(x == "example" or (x not in BUILTINS and ":" in x and resolve(x) is chrome) for x in items):
        return ",".join(items)
    return ",".join(items + ["example"])


def has_example(spec: str | None) -> bool:
    """Whether a plugin spec loads the example (Chrome-trace) plugin, by its name or its module path."""
    return with_example(spec) == ",".join(x.strip() for x in (spec or "").split(",") if x.strip())


def backend_source(a: argparse.Namespace, s: Settings) -> str:
    """Where the backend came from, for an error about it: the flag, the variable, or the default."""
    if a.backend:
        return f"--backend {s.backend}"
    var = env_source("backend")
    return f"{var}={s.backend!r}" if var else f"the default backend {s.backend!r}"


def _settings(overrides: dict) -> Settings:
    try:
        return Settings.from_env(**overrides)
    except ConfigError as e:                    # a flag's value: name the flag, not the setting it sets
        attr, _, rest = str(e).partition("=")
        flag = {"backend": "--backend", "nchannels": "--channels", "timeout_s": "-T"}.get(attr)
        if flag is None or attr not in overrides:
            raise
        raise UsageError(f"{flag} {rest}") from None


def bench_settings(a: argparse.Namespace) -> tuple[Settings, dict]:
    """(the run's Settings, the overrides the ranks get): the flags applied over the environment."""
    overrides: dict = {}
    if a.backend:
        overrides["backend"] = a.backend
    if a.channels is not None:
        overrides["nchannels"] = a.channels
    if a.timeout is not None:
        overrides["timeout_s"] = a.timeout
    if a.profile is not None and a.profile >= 0:      # a bare --profile (-1) keeps the variable's mask
        overrides["profile_event_mask"] = a.profile
    env_plugins = _settings(overrides).profiler_plugin      # with the flags: -T 5 beats SLICETRACE_TIMEOUT=0
    if a.trace is not None or a.profile is not None:    # both write through the example plugin: add it if missing
        overrides["profiler_plugin"] = with_example(env_plugins)
    elif a.overhead:                            # the environment's plugins are what --overhead measures, if any
        overrides["profiler_plugin"] = with_example(None) if (env_plugins or "none").strip().lower() == "none" \
            else env_plugins
    if a.trace is not None:             # the folder is made by run_bench, after every check
        overrides["profile_dump_file"] = os.path.join(a.trace, "trace")
    s = _settings(overrides)
    if s.timeout_s < 1:             # -T below 1 s was refused by check_flags: this one is the variable's
        raise UsageError(f"{env_source('timeout_s')}={s.timeout_s:g} must be >= 1 second for bench: {_WHY_1S}; "
                         f"unset it (default 60) or give -T")
    if a.overhead_of == "kernel_step" and (a.profile is None or a.profile < 0) and s.profile_event_mask is not None \
            and not s.profile_event_mask & KERNEL_STEP:        # --profile's own mask was checked with the flags
        raise UsageError(f"--overhead-of kernel_step: SLICETRACE_PROFILE_EVENT_MASK={s.profile_event_mask} has no "
                         f"KernelStep bit ({KERNEL_STEP}); nothing to compare")
    if s.backend not in ("cpu", "cuda"):         # null: the tests' backend moves no data, so no sane row
        raise UsageError(f"{backend_source(a, s)}: bench runs 'cpu' or 'cuda' ({s.backend!r} is a test backend "
                         f"that moves no data)")
    # a bare --profile (-1) takes the variable's mask: checked here, as --profile MASK is below
    if (a.trace is not None or a.profile == -1) and s.profile_event_mask is not None \
            and not s.profile_event_mask & ALL_TYPES:
        flag, src = ((f"--trace {a.trace!r}", "SLICETRACE_PROFILE_EVENT_MASK or --profile") if a.trace is not None
                     else ("--profile", "SLICETRACE_PROFILE_EVENT_MASK"))
        raise UsageError(f"{flag} with event mask {s.profile_event_mask} ({src}) records nothing: it has no event "
                         f"type's bit ({ALL_TYPES:#x}); leave the mask unset or give the event types to record")
    k = s.op_sample_rate
    if a.overhead and k > 1 and a.iters % k:    # else blocks hold different numbers of profiled ops: the median
        raise UsageError(f"--overhead with SLICETRACE_PROFILE_OP_SAMPLE_RATE={k}: -n {a.iters} is not a multiple of "
                         f"{k}, so the timed blocks would profile different numbers of ops and the median of their "
                         f"ratios would mislead; give -n a multiple of {k} (e.g. -n {k * max(1, a.iters // k)})")
    if a.profile is not None and a.profile != -1 and not a.profile & ALL_TYPES:    # "profiling on", nothing recorded
        raise UsageError(f"--profile {a.profile} records nothing: it has no event type's bit ({ALL_TYPES:#x}); give "
                         f"the event types to record (e.g. --profile 'Coll|KernelCh|KernelStep'), a bare --profile for "
                         f"the default mask, or leave it out")
    want = {"gloo": "cpu", "nccl": "cuda"}.get(a.compare or "")
    if want and s.backend != want:              # each reference runs where its library runs: same buffers, same device
        raise SliceTraceError(f"--compare {a.compare} runs beside --backend {want}, not {backend_source(a, s)} "
                              f"(--compare gloo with cpu, --compare nccl with cuda)")
    if want and importlib.util.find_spec("torch") is None:      # before any rank starts
        raise UsageError(f"--compare {a.compare} needs torch installed (pip install torch)")
    return s, overrides


def register_pool(a: argparse.Namespace, s: Settings, swept: list[int], ops: list[str], dtypes: list,
                  nranks: int) -> int:
    """-R 1: the cpu_pool bytes one rank needs for the sweep's largest buffers (SLICETRACE_CPU_POOL's if larger)."""
    if s.backend != "cpu":
        raise UsageError(f"-R {a.register}: registered buffers are the cpu backend's (Comm.mem_alloc); "
                         f"{backend_source(a, s)} allocates its buffers as usual: leave -R out")
    need = max(rank_bytes(op, swept[-1], np_dtype(d).itemsize, nranks, False)[0] for op in ops for d in dtypes)
    return max(s.cpu_pool, -(-need // 4096) * 4096 + 2 * 4096)     # two buffers, each rounded up to a page
