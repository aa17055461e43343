"""launch() refuses a flight recorder prefix that is the example plugin's before any rank starts (as it refuses
an unwritable prefix): one ConfigError naming both settings where they came from, not one error per rank."""
from __future__ import annotations

import os

import pytest

import slicetrace
from slicetrace.errors import ConfigError
from slicetrace.launch_checks import launch_settings


def _rank(comm):
    return comm.rank


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ("SLICETRACE_PROFILER_PLUGIN", "SLICETRACE_PROFILE_DUMP_FILE", "SLICETRACE_FLIGHTREC_FILE"):
        monkeypatch.delenv(var, raising=False)


def test_the_example_plugins_prefix_is_refused_in_the_launcher_naming_both_keywords(tmp_path):
    """Before: every rank's flightrec init raised it, after the launch (a LaunchError with one error per rank)."""
    p = str(tmp_path / "run")
    with pytest.raises(ConfigError) as e:
        slicetrace.launch(_rank, 2, profiler_plugin="example,flightrec", profile_dump_file=p, flightrec_file=p)
    assert str(e.value) == (f"flightrec_file={p!r} is also profile_dump_file={p!r}: the flightrec and example plugins "
                            f"would write the same files (<prefix>_<commHash>_<rank>.json); give the flight recorder "
                            f"a prefix of its own")
    assert list(tmp_path.iterdir()) == []           # no rank ran: not even the example plugin's folder


def test_the_same_prefix_spelled_two_ways_is_refused_naming_the_variables(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLICETRACE_FLIGHTREC_FILE", "rec")
    monkeypatch.setenv("SLICETRACE_PROFILE_DUMP_FILE", os.path.join(str(tmp_path), "rec"))
    with pytest.raises(ConfigError, match=r"^SLICETRACE_FLIGHTREC_FILE='rec' is also SLICETRACE_PROFILE_DUMP_FILE="
                                          r"'.*/rec': the flightrec and example plugins would write the same files"):
        launch_settings(_rank, 2, (), None, {"profiler_plugin": "flightrec"})


def test_a_prefix_of_its_own_or_no_flight_recorder_passes(tmp_path):
    p = str(tmp_path / "run")
    _, s = launch_settings(_rank, 2, (), None, {"profiler_plugin": "example,flightrec", "profile_dump_file": p,
                                                 "flightrec_file": p + "_fr"})
    assert s.flightrec_file == p + "_fr"
    _, s = launch_settings(_rank, 2, (), None, {"profiler_plugin": "example", "profile_dump_file": p,
                                                 "flightrec_file": p})     # flightrec not loaded: its prefix unused
    assert s.profile_dump_file == p
