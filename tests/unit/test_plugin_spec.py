"""profiler_plugin specs as users mistype them: an unknown item of a comma list is named with its place in the
list, and a name off by case or a letter gets a did-you-mean."""
from __future__ import annotations

import pytest

from slicetrace.config import Settings
from slicetrace.errors import PluginError, closest
from slicetrace.events.loading import load_plugins

KNOWN = "(['example', 'linkstats']) nor a 'module:attr' path"


@pytest.mark.parametrize("spec,msg", [
    # before: "profiler_plugin='nope' is not ...", the list it was item 2 of unsaid
    ("example,nope", f"profiler_plugin='example,nope': item 2 of 2, 'nope', is not a built-in or entry point name "
                     f"{KNOWN}; use 'none' to disable profiling"),
    ("nope, example", f"profiler_plugin='nope, example': item 1 of 2, 'nope', is not a built-in or entry point name "
                      f"{KNOWN}; use 'none' to disable profiling"),
    # before: no hint at all
    ("Example", f"profiler_plugin='Example' is not a built-in or entry point name {KNOWN} (did you mean 'example'? "
                f"plugin names are case-sensitive); use 'none' to disable profiling"),
    ("example,linkstat", f"profiler_plugin='example,linkstat': item 2 of 2, 'linkstat', is not a built-in or entry "
                         f"point name {KNOWN} (did you mean 'linkstats'?); use 'none' to disable profiling"),
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
