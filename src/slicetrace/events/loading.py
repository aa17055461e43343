"""Loading profiler plugins from a spec: built-in names, 'module:attr' paths and entry points."""
from __future__ import annotations

import importlib
import logging
from importlib import metadata
from typing import Any

from ..errors import PluginError, closest
from .plugin import LoadedPlugin

log = logging.getLogger("slicetrace")

ENTRY_POINT_GROUP = "slicetrace.profilers"
# Imported lazily by string: events must not import sinks.
BUILTINS: dict[str, str] = {"example": "slicetrace.sinks.chrome:ChromePlugin",
                             "linkstats": "slicetrace.sinks.linkstats:LinkStatsPlugin",
                             "inspector": "slicetrace.sinks.inspector:InspectorPlugin",
                             "flightrec": "slicetrace.sinks.flightrec:FlightRecPlugin"}
_SPEC = "profiler_plugin (SLICETRACE_PROFILER_PLUGIN)"     # where a spec comes from, when the caller cannot tell


def _entry_points() -> dict[str, Any]:
    try:
        return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    except Exception:                     # a broken distribution must not stop communication
        log.debug("reading entry points of %s failed", ENTRY_POINT_GROUP, exc_info=True)
        return {}


def _import(path: str, item: str) -> Any:
    mod, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(mod)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as e:      # also what the module's own code raises, and ValueError/TypeError for ':x', '.x:y'
        why = e if isinstance(e, (ImportError, AttributeError)) else f"{type(e).__name__}: {e}"
        raise PluginError(f"profiler_plugin item {item!r}: cannot import {path!r} ({why})") from e
    return obj


def resolve(item: str, source: str = _SPEC, where: str = "") -> Any:
    """One plugin spec -> the object it names (a built-in name, `module:attr`, or an entry point name); source:
    where the spec came from (the keyword or the variable), named in the error; where: the item's place in a comma
    list, said in the error in place of `source=item`."""
    if item in BUILTINS:
        return _import(BUILTINS[item], item)
    if ":" in item:
        return _import(item, item)
    eps = _entry_points()
    if item in eps:
        try:
            return eps[item].load()
        except Exception as e:
            raise PluginError(f"profiler_plugin item {item!r}: entry point {eps[item].value!r} failed to load ({e})") from e
    known = sorted(set(BUILTINS) | set(eps))
    near = closest(item, known)
    case = " plugin names are case-sensitive" if near and near.lower() == item.lower() else ""
    hint = f" (did you mean {near!r}?{case})" if near else ""
    raise PluginError(f"{where or f'{source}={item!r}'} is not a built-in or entry point name ({known}) nor a "
                      f"'module:attr' path{hint}; use 'none' to disable profiling")


def _construct(factory: Any, item: str, settings: Any) -> Any:
    """factory(settings), or factory() when it cannot take one positional argument (keyword-only or no parameters);
    a factory that fails is a PluginError."""
    import inspect
    takes = True
    try:
        sig = inspect.signature(factory)
        try:
            sig.bind(settings)
        except TypeError:
            sig.bind()
            takes = False
    except (TypeError, ValueError):         # no signature, or neither call binds: the documented call
        takes = True
    try:
        return factory(settings) if takes else factory()
    except Exception as e:
        raise PluginError(f"profiler_plugin item {item!r}: {type(e).__name__} from {item}({'settings' if takes else ''}): "
                          f"{e}") from e


def load_plugins(spec: str | None, settings: Any, source: str = _SPEC) -> list[LoadedPlugin]:
    """Load every plugin of a comma-separated spec ('none', '' or None = no plugins); source: where the spec came
    from (config.value_source), named in its errors.

    A resolved class, or an object without `init` (a factory), is called with `(settings)` if it takes one
    positional argument, else with none; an object with `init` is the plugin itself.
    """
    if spec is None or spec.strip().lower() in ("", "none"):
        return []
    out: list[LoadedPlugin] = []
    seen: list[Any] = []
    items = [s.strip() for s in spec.split(",")]
    for k, item in enumerate(items, 1):
        if not item:
            continue
        if item.lower() == "none":
            raise PluginError(f"{source}={spec!r}: 'none' cannot be combined with other plugins")
        obj = resolve(item, source, "" if len(items) == 1 else f"{source}={item!r} (item {k} of {len(items)} in "
                                                               f"{spec!r})")
        if any(o is obj for o in seen):                 # two of one plugin would write the same files
            raise PluginError(f"{source}={spec!r}: {item!r} is listed twice (maybe by another name); list each "
                              f"plugin once")
        seen.append(obj)
        if isinstance(obj, type) or not hasattr(obj, "init"):
            if not callable(obj):
                raise PluginError(f"profiler_plugin item {item!r} resolved to {obj!r}, which is neither a plugin "
                                  f"(has init) nor a factory called with settings")
            obj = _construct(obj, item, settings)
        out.append(LoadedPlugin(obj, item))
    return out
