"""Settings' keywords and the event-mask forms: the same errors and forms from every door (the constructor,
with_, from_env's keywords, the SLICETRACE_* variables, comm.profiling())."""
from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

from slicetrace.api_checks import profile_mask
from slicetrace.config import VARIABLES, Settings
from slicetrace.errors import ConfigError, PluginError, UsageError
from slicetrace.events.abi import parse_mask
from slicetrace.events.loading import load_plugins


@pytest.mark.parametrize("kw,named", [({"foo": 1}, r"\['foo'\]"),
                                      ({"nchanels": 2}, r"\['nchanels'\] \(did you mean nchannels for nchanels\?\)")])
def test_settings_refuses_an_unknown_keyword_as_with_does(kw, named):
    # Settings is public: Settings(foo=1) raised dataclasses' bare TypeError, with_(foo=1) a ConfigError
    for make in (lambda: Settings(**kw), lambda: Settings().with_(**kw)):
        with pytest.raises(ConfigError, match=rf"^unknown setting\(s\) {named}; known: \[.*'nchannels'.*\]$"):
            make()


def test_settings_refuses_more_positional_arguments_than_fields():
    with pytest.raises(ConfigError, match=r"^Settings takes at most 33 positional arguments \(its fields in order\), "
                                          r"got 34; pass settings by keyword$"):
        Settings(*(["cpu"] * 34))


def test_settings_still_builds_copies_and_pickles():
    s = Settings("null", nchannels=2)
    assert (s.backend, s.nchannels) == ("null", 2)
    assert pickle.loads(pickle.dumps(s)) == s and s.with_(nchannels=3).nchannels == 3


MASK_VAR = "SLICETRACE_PROFILE_EVENT_MASK"


@pytest.mark.parametrize("raw", ["0o7", "0b11", "1_0", "0x1_0", "+3", "07", "\u0667"])
def test_a_mask_keyword_refuses_the_integer_forms_its_variable_refuses(raw):
    # README: integers are decimal (no leading zero) or 0x hex, nothing else; the variable refused 0o7 while the
    # keyword, comm.profiling(mask=) and bench --profile (all through parse_mask's int(v, 0)) took it as 7
    why = rf"'{re.escape(raw)}' is not a decimal \(no leading zero\) or 0x hex integer"
    with pytest.raises(ConfigError, match=rf"^{MASK_VAR}='{re.escape(raw)}' cannot be parsed \({why}\): expected an integer"):
        Settings.from_env({MASK_VAR: raw})
    with pytest.raises(ConfigError, match=rf"^profile_event_mask='{re.escape(raw)}': {why}; expected an integer, decimal or 0x"):
        Settings.from_env({}, profile_event_mask=raw)
    with pytest.raises(UsageError, match=rf"^mask='{re.escape(raw)}': {why}"):
        profile_mask(raw)
    with pytest.raises(ValueError, match=why):
        parse_mask(raw)


@pytest.mark.parametrize("raw,mask", [("65606", 65606), (" 0x10046 ", 65606), ("0X10", 16), ("0", 0),
                                      ("Coll|KernelStep", 65538), ("coll, kernel_step", 65538)])
def test_every_mask_door_takes_the_documented_forms_alike(raw, mask):
    assert Settings.from_env({MASK_VAR: raw}).profile_event_mask == mask
    assert Settings.from_env({}, profile_event_mask=raw).profile_event_mask == mask
    assert profile_mask(raw) == mask == parse_mask(raw)


def test_none_turns_profiling_off_in_any_case_as_documented():
    # load_plugins, bench's flags and the README agree: 'none' in any case (a str(None) too) is no plugin, alone
    for spec in ("none", "None", "NONE", " none "):
        assert load_plugins(spec, Settings()) == [] and load_plugins(Settings(profiler_plugin=spec).profiler_plugin,
                                                                     Settings()) == []
    with pytest.raises(PluginError, match=r"'none' cannot be combined with other plugins"):
        load_plugins("example,None", Settings())
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `SLICETRACE_PROFILER_PLUGIN` |"))
    assert "`none` (any case, as `None`; alone)" in row
    assert "or `none` (any case, alone; plugin names are case-sensitive)" in readme
    assert "'none' (any case) to disable" in next(v.doc for v in VARIABLES if v.attr == "profiler_plugin")
