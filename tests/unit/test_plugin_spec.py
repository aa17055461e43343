"""profiler_plugin as users give it: an unknown item of a comma list is named with its place in the list, a name
off by case or a letter gets a did-you-mean, and a plugin class is taken as the spec the ranks import."""
from __future__ import annotations

import pytest

from slicetrace.config import Settings
from slicetrace.errors import ConfigError, PluginError, closest
from slicetrace.events.loading import load_plugins
from tests.helpers.plugins import CtorFails, NoopPlugin

KNOWN = "(['example', 'flightrec', 'inspector', 'linkstats']) nor a 'module:attr' path"


@pytest.mark.parametrize("spec,msg", [
    # before: "profiler_plugin='nope' is not ...", the list it was item 2 of unsaid
    ("example,nope", f"profiler_plugin='nope' (item 2 of 2 in 'example,nope') is not a built-in or entry point name "
                     f"{KNOWN}; use 'none' to disable profiling"),
    ("nope, example", f"profiler_plugin='nope' (item 1 of 2 in 'nope, example') is not a built-in or entry point name "
                      f"{KNOWN}; use 'none' to disable profiling"),
    # before: no hint at all
    ("Example", f"profiler_plugin='Example' is not a built-in or entry point name {KNOWN} (did you mean 'example'? "
                f"plugin names are case-sensitive); use 'none' to disable profiling"),
    ("example,linkstat", f"profiler_plugin='linkstat' (item 2 of 2 in 'example,linkstat') is not a built-in or "
                         f"entry point name {KNOWN} (did you mean 'linkstats'?); use 'none' to disable profiling"),
    ("nope", f"profiler_plugin='nope' is not a built-in or entry point name {KNOWN}; use 'none' to disable "
             f"profiling"),
])
def test_an_unknown_plugin_is_named_with_its_place_and_the_closest_name(spec, msg):
    with pytest.raises(PluginError) as e:
        load_plugins(spec, Settings(), "profiler_plugin")
    assert str(e.value) == msg


def test_closest_prefers_a_name_that_differs_in_case_only():
    assert closest("Example", ["linkstats", "example"]) == "example"
    assert closest("NCHANNEL", ["NCHANNELS", "TIMEOUT"]) == "NCHANNELS"
    assert closest("debug", ["DEBUG", "DRAIN_INTERVAL_US"]) == "DEBUG"      # difflib alone found nothing
    assert closest("xyzzy", ["DEBUG", "TIMEOUT"]) is None


# ---- profiler_plugin=<a class>: its 'module:qualname' spec, which the ranks import ----

def _local_plugin_class():
    class Local(NoopPlugin):
        pass
    return Local


def test_a_plugin_class_or_factory_defined_at_a_module_top_level_is_taken_as_its_spec():
    """Before: "profiler_plugin=<class ...> (type type) is not accepted: profiler_plugin must be a str or None"."""
    assert Settings(profiler_plugin=NoopPlugin).profiler_plugin == "tests.helpers.plugins:NoopPlugin"
    assert Settings.from_env({"SLICETRACE_PROFILER_PLUGIN": "example"}, profiler_plugin=CtorFails).profiler_plugin \
        == "tests.helpers.plugins:CtorFails"            # the keyword beats the variable, as a str does
    assert Settings(profiler_plugin=_factory).profiler_plugin == "tests.unit.test_plugin_spec:_factory"
    (lp,) = load_plugins(Settings(profiler_plugin=NoopPlugin).profiler_plugin, Settings())
    assert type(lp.plugin) is NoopPlugin


def _factory(settings):
    return NoopPlugin()


@pytest.mark.parametrize("value,spec", [(_local_plugin_class(), "tests.unit.test_plugin_spec:_local_plugin_class."
                                                                "<locals>.Local"),
                                        (lambda s: NoopPlugin(), "tests.unit.test_plugin_spec:<lambda>")])
def test_a_plugin_class_the_ranks_cannot_import_is_refused_saying_why(value, spec):
    with pytest.raises(ConfigError) as e:
        Settings(profiler_plugin=value)
    assert str(e.value) == (f"profiler_plugin={value!r} (type {type(value).__name__}) cannot be imported as "
                            f"'{spec}', and the ranks launch() starts load plugins by import: define it at a "
                            f"module's top level, or pass a 'module:attr' str")


@pytest.mark.parametrize("value,tail", [(NoopPlugin(), "; ranks load their plugins by import, so pass the plugin's "
                                                       "class (or 'module:attr'), not an instance of it"),
                                        (5, ""), (["example"], "")])
def test_a_plugin_object_or_other_value_is_refused_with_what_is_accepted(value, tail):
    with pytest.raises(ConfigError) as e:
        Settings(profiler_plugin=value)
    assert str(e.value) == (f"profiler_plugin={value!r} (type {type(value).__name__}) is not accepted: "
                            f"profiler_plugin must be a str or None (a spec: 'example', 'linkstats', 'inspector', "
                            f"'flightrec', 'module:attr', "
                            f"an entry point name, a comma list of them, or 'none'; None: no plugin), or a plugin "
                            f"class or factory function defined at a module's top level{tail}")
