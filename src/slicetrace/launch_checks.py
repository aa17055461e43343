"""launch()'s arguments, checked before any process starts: fn (callable, importable by name, picklable with its
args), nranks, join_timeout_s, and the settings (init()'s, not fn's) with the shared memory and plugins they need."""
from __future__ import annotations

from multiprocessing.reduction import ForkingPickler
import os
from typing import Any, Callable

import numpy as np

from .api_checks import as_index, seconds_or_none
from .backend.cpu.shm import shm_shortfall
from .config import Settings, inspector_dir, inspector_dir_named, unwritable, value_source
from .errors import ConfigError, UsageError
from .events.loading import load_plugins


def launch_settings(fn: Callable, nranks: Any, args: tuple, join_timeout_s: Any,
                    settings: dict[str, Any]) -> tuple[int, Settings]:
    """(nranks as an int, the Settings of every rank) for launch(fn, nranks, *args, join_timeout_s=,
    **settings); UsageError or ConfigError naming the argument otherwise."""
    if not callable(fn):
        raise UsageError(f"fn={fn!r} (type {type(fn).__name__}) must be callable: a function defined at the top "
                         f"level of a module, run as fn(comm, *args) on every rank")
    n = as_index(nranks)
    if n is None or n < 1:
        raise UsageError(f"nranks={nranks!r} must be an int >= 1")
    nranks = n
    seconds_or_none(join_timeout_s, "join_timeout_s", "no limit (a failing rank still ends the others within "
                    "timeout_s)")
    if "<" in getattr(fn, "__qualname__", ""):
        raise UsageError(f"fn={fn.__qualname__!r}: spawned ranks import fn by name, so it must be a function defined "
                         f"at the top level of a module (not a lambda or a nested function)")
    _check_picklable(fn, args)
    own = sorted(set(settings) & {"rank", "world_size", "store", "job", "name"})
    if own:                             # passed on, they met launch()'s own: a TypeError in every rank
        raise UsageError(f"launch(): {', '.join(f'{k}=' for k in own)}: init()'s own arguments, not settings; "
                         f"launch() sets them for each rank (for a named communicator, call init(name=...) in fn)")
    try:
        s = Settings.from_env(**settings)
    except ConfigError as e:            # launch(fn, 2, lr=0.1): fn's own arguments go positionally
        if not str(e).startswith("unknown setting"):
            raise
        raise ConfigError(f"launch(): {e}; its keywords are init()'s settings: give fn's own arguments after "
                          f"nranks, launch(fn, n, *args), or bind them with functools.partial") from None
    # as the ranks load them (each rank again): a bad spec is one error here, naming the keyword, not one per rank
    loaded = load_plugins(s.profiler_plugin, s, value_source("profiler_plugin", s.profiler_plugin))
    if any(lp.name == "flightrec" for lp in loaded):
        _own_flightrec_prefix(s)
    for lp in loaded:
        attr = _PREFIXES.get(lp.name)
        prefix = getattr(s, attr) if attr else None
        if lp.name == "inspector":      # a folder, not a prefix (its default depends on SLURM_JOBID)
            why, named, want = unwritable(inspector_dir(s)), inspector_dir_named(s), "writable folder"
        else:
            why = unwritable(os.path.dirname(prefix) or ".") if prefix else None
            named, want = f"{value_source(attr, prefix)}={prefix!r}", "prefix in a writable folder"
        if why is not None:             # else each rank's plugin init fails, after the launch
            raise ConfigError(f"{named}: cannot write files in {why[0]!r} ({why[1]}); give a {want}")
    why = shm_shortfall(nranks, s.channels, s.buffsize, s.ring_slots, s.cpu_pool) if s.backend == "cpu" else None
    if why is not None:                 # before any rank starts: a typo of 100000 would spawn them all
        raise UsageError(f"nranks={nranks}: {why}, or give fewer nranks")
    return nranks, s


# a built-in plugin's name -> the setting that prefixes its files (<prefix>_<commHash>_<rank>.*; folders made at init,
# flightrec's at its first dump: probed, never made, so a healthy run leaves none)
_PREFIXES = {"example": "profile_dump_file", "linkstats": "linkstats_file", "flightrec": "flightrec_file"}


def _own_flightrec_prefix(s: Settings) -> None:
    """flightrec's init refuses the example plugin's prefix (sinks/flightrec.py, the same test): else every rank
    raises it after the launch."""
    ex, fr = s.profile_dump_file, s.flightrec_file
    if ex and os.path.abspath(ex) == os.path.abspath(fr):
        raise ConfigError(f"{value_source('flightrec_file', fr)}={fr!r} is also {value_source('profile_dump_file', ex)}"
                          f"={ex!r}: the flightrec and example plugins would write the same files "
                          f"(<prefix>_<commHash>_<rank>.json); give the flight recorder a prefix of its own")


def _check_picklable(fn: Callable, args: tuple) -> None:
    """Spawned ranks get fn and args pickled: one that cannot be is named here, before any process starts, and not
    as a bare TypeError from Process.start."""
    for what, v in (("fn", fn), *((f"args[{i}]", a) for i, a in enumerate(args))):
        if isinstance(v, (bytes, bytearray, str, int, float)) or (isinstance(v, np.ndarray) and not v.dtype.hasobject):
            continue                                  # always pickle: no second copy of a large array
        try:
            ForkingPickler(_Discard()).dump(v)        # what Process.start would do, into no buffer
        except RuntimeError as e:
            if "through inheritance" not in str(e):     # a multiprocessing Lock, Queue: pickled only when spawning
                raise UsageError(f"{what}={v!r} cannot be sent to the spawned ranks (pickle): {e}") from None
        except Exception as e:  # noqa: BLE001 - pickle fails as TypeError, AttributeError, PicklingError
            raise UsageError(f"{what}={v!r} cannot be sent to the spawned ranks (pickle): {type(e).__name__}: {e}; "
                             f"pass plain data (numbers, strings, numpy arrays) and create locks, files and "
                             f"connections inside fn") from None


class _Discard:
    def write(self, b: bytes) -> int:
        return len(b)
