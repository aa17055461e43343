"""How config reads a variable's text: booleans, strict integers, byte sizes, event masks and seconds, each
parser with what it accepts (for config's error messages), and the type test of each Settings annotation. Reads no
environment (config does)."""
from __future__ import annotations

import numbers
import re
import sys
from typing import Any, Callable

from .errors import ConfigError
from .events.abi import INT_TEXT, parse_mask


def is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def no_nul(v: str) -> bool:
    """A path's rule: a NUL byte is a ValueError in open() (in a plugin's init: logged, the plugin dropped, no file)."""
    return "\0" not in v


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


# Settings annotation -> (type test, what it accepts): config checks every field of a Settings by it
TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "str": (lambda v: isinstance(v, str), "a str"),
    "str | None": (lambda v: v is None or isinstance(v, str), "a str or None"),
    "int": (is_int, "an int (not a bool)"),
    "int | None": (lambda v: v is None or is_int(v), "an int (not a bool) or None"),
    "float": (_is_real, "a number (int or float, not a bool)"),
    "bool": (lambda v: isinstance(v, bool), "a bool (True or False)"),
}


def as_bool(v: str) -> bool:
    if v.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if v.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(v)


def as_int(v: str) -> int:
    t = v.strip()
    if not INT_TEXT.fullmatch(t):           # what the README promises, no more
        raise ValueError(f"{v!r} is not a decimal (no leading zero) or 0x hex integer")
    return int(t, 0)


def as_bytes(v: str) -> int:
    """An integer, or one with a binary suffix K, M or G (64K = 65536), as the bench's -b/-e take."""
    t = v.strip().upper()
    if not t.startswith("0X"):               # hex digits include B
        for i, suffix in enumerate("KMG"):
            if t.endswith((suffix, suffix + "B")):
                return as_int(t[:t.rindex(suffix)]) << (10 * (i + 1))
    return as_int(t)


def as_mask(v: str) -> int:
    return parse_mask(v)        # its integers as strict as as_int's, from a keyword or the CLI too


_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")


def as_seconds(v: str) -> float:
    """Decimal seconds, as the README says ('2.5'): float() also took '1_0', '1e3', 'inf' and non-ASCII digits."""
    t = v.strip()
    if not _SECONDS.fullmatch(t):
        raise ValueError(v)
    return float(t)


_PLUGIN_SPECS = ("a str or None (a spec: 'example', 'linkstats', 'inspector', 'flightrec', 'module:attr', an entry point name, a comma list of "
                 "them, or 'none'; None: no plugin), or a plugin class or factory function defined at a module's top "
                 "level")


def plugin_spec(v: Any) -> str | None:
    """profiler_plugin as given: a spec str or None as it is; a plugin class or factory function as its
    'module:qualname' spec, which the ranks that launch() spawns import (an object itself would not reach them).
    Anything else is a ConfigError saying why and what to pass."""
    if v is None or isinstance(v, str):
        return v
    mod, qual = getattr(v, "__module__", None), getattr(v, "__qualname__", None)
    if not callable(v) or not isinstance(mod, str) or not isinstance(qual, str):
        why = ("; ranks load their plugins by import, so pass the plugin's class (or 'module:attr'), not an "
               "instance of it") if hasattr(v, "init") else ""
        raise ConfigError(f"profiler_plugin={v!r} (type {type(v).__name__}) is not accepted: profiler_plugin must "
                          f"be {_PLUGIN_SPECS}{why}")
    if mod == "__mp_main__" and sys.modules.get(mod) is sys.modules.get("__main__"):
        mod = "__main__"        # a spawned process's name for its parent's script: one spec in every process
    obj: Any = sys.modules.get(mod)
    for part in qual.split("."):
        obj = getattr(obj, part, None)
    if obj is not v:            # a local class or lambda ('f.<locals>.P'), or one its module's name no longer gives
        raise ConfigError(f"profiler_plugin={v!r} (type {type(v).__name__}) cannot be imported as "
                          f"'{mod}:{qual}', and the ranks launch() starts load plugins by import: define it at a "
                          f"module's top level, or pass a 'module:attr' str")
    return f"{mod}:{qual}"


# what each parser accepts, for its error message
FORMATS: dict[Callable[[str], Any], str] = {
    as_bool: "one of 0/1/true/false/yes/no/on/off (any case; empty = off)",
    as_int: "an integer, decimal or 0x hex",
    as_bytes: "bytes: an integer, or one with a binary suffix K, M or G (e.g. 65536, 64K, 4M)",
    as_seconds: "a number of seconds, e.g. 60 or 2.5",
    as_mask: "an integer, decimal or 0x hex, e.g. 65606 or 0x10046, or event type names joined by '|' or ',', "
             "e.g. Coll|P2p|KernelCh|KernelStep (the same mask)",
}
