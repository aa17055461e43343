"""launch()'s plugin spec is loaded in the launching process, as the ranks load it, so a bad one is one error there,
before any rank starts, naming where the spec came from: the keyword given, else the variable."""
from __future__ import annotations

import pytest

import slicetrace
from slicetrace.config import value_source
from slicetrace.errors import PluginError
from slicetrace.launch_checks import launch_settings


def _rank(comm):
    return comm.rank


@pytest.fixture(autouse=True)
def _no_env_plugin(monkeypatch):
    monkeypatch.delenv("SLICETRACE_PROFILER_PLUGIN", raising=False)


def test_a_bad_plugin_keyword_fails_in_the_launcher_naming_the_keyword():
    """Before: every rank failed (a LaunchError) with "profiler_plugin (SLICETRACE_PROFILER_PLUGIN)='nope'", a
    variable nobody set. A PluginError, not a LaunchError: no rank ran."""
    with pytest.raises(PluginError, match=r"^profiler_plugin='nope' is not a built-in or entry point name "
                                          r"\(\['example', 'flightrec', 'inspector', 'linkstats'\]\) nor a "
                                          r"'module:attr' path"):
        slicetrace.launch(_rank, 2, profiler_plugin="nope")


def test_the_keyword_beats_a_bad_variable_and_is_the_one_named(monkeypatch):
    monkeypatch.setenv("SLICETRACE_PROFILER_PLUGIN", "nope")
    with pytest.raises(PluginError, match=r"^profiler_plugin='nope2' \(item 2 of 2 in 'example,nope2'\) is not a "
                                          r"built-in"):
        slicetrace.launch(_rank, 2, profiler_plugin="example,nope2")
    with pytest.raises(PluginError, match=r"^SLICETRACE_PROFILER_PLUGIN='nope' is not a built-in"):
        slicetrace.launch(_rank, 2)


@pytest.mark.parametrize("spec,why", [
    ("tests.helpers.plugins:Missing", r"^profiler_plugin item 'tests.helpers.plugins:Missing': cannot import"),
    ("tests.helpers.plugins:CtorFails", r"^profiler_plugin item 'tests.helpers.plugins:CtorFails': ValueError from "
                                        r".*: needs a license file"),
    ("example,none", r"^profiler_plugin='example,none': 'none' cannot be combined with other plugins"),
])
def test_a_plugin_that_will_not_load_or_be_made_fails_in_the_launcher(spec, why):
    with pytest.raises(PluginError, match=why):
        slicetrace.launch(_rank, 2, profiler_plugin=spec)


def test_init_names_its_keyword_too():
    """init() in one process: the keyword given, not the variable."""
    with pytest.raises(PluginError, match=r"^profiler_plugin='nope' is not a built-in"):
        slicetrace.init(backend="null", profiler_plugin="nope")


def test_value_source_names_the_variable_only_when_it_holds_the_value():
    env = {"SLICETRACE_PROFILER_PLUGIN": "nope", "SLICETRACE_BUFFSIZE": "4M", "SLICETRACE_NCHANNELS": "x"}
    assert value_source("profiler_plugin", "nope", env) == "SLICETRACE_PROFILER_PLUGIN"
    assert value_source("profiler_plugin", "other", env) == "profiler_plugin"
    assert value_source("buffsize", 4 << 20, env) == "SLICETRACE_BUFFSIZE"      # parsed, as Settings reads it
    assert value_source("nchannels", 2, env) == "nchannels"                     # an unparsable variable lost
    assert value_source("timeout_s", 5.0, env) == "timeout_s"                   # unset


@pytest.mark.parametrize("spec,enabled,recording", [
    ("tests.helpers.plugins:InitFails", False, []),
    ("tests.helpers.plugins:InitFails,tests.helpers.plugins:NoopPlugin", True, ["noop"]),
])
def test_a_communicator_whose_plugins_all_failed_in_init_is_not_profiling(spec, enabled, recording):
    """Before: profiler_enabled stayed True with no plugin left (a drain and a SIGTERM handler for nobody)."""
    import numpy as np
    with slicetrace.init(backend="cpu", profiler_plugin=spec) as comm:
        assert comm.profiler_enabled is enabled and comm.profiler_plugins == recording
        assert comm.drop_counters()["plugin_init_failed"] == 1
        x = np.ones(1024, np.float32)
        assert (comm.all_reduce(x) == x).all()          # communication goes on without them


@pytest.mark.parametrize("plugin,attr", [("example", "profile_dump_file"), ("linkstats", "linkstats_file"),
                                         ("flightrec", "flightrec_file")])
def test_a_prefix_in_no_writable_folder_fails_in_the_launcher(tmp_path, monkeypatch, plugin, attr):
    """Before: each rank's plugin init failed after the launch, naming the variable too (flightrec: a LaunchError
    with one such error per rank)."""
    (tmp_path / "f").write_text("")                     # a file where the prefix wants a folder
    prefix = str(tmp_path / "f" / "run")
    with pytest.raises(slicetrace.errors.ConfigError) as e:
        slicetrace.launch(_rank, 2, profiler_plugin=plugin, **{attr: prefix})
    assert str(e.value) == (f"{attr}={prefix!r}: cannot write files in {str(tmp_path / 'f')!r} (Not a directory); "
                            f"give a prefix in a writable folder")
    monkeypatch.setenv(f"SLICETRACE_{attr.upper()}", prefix)          # from the variable: it is the one named
    with pytest.raises(slicetrace.errors.ConfigError, match=rf"^SLICETRACE_{attr.upper()}='"):
        slicetrace.launch(_rank, 2, profiler_plugin=plugin)


def test_the_flight_recorders_folder_is_probed_in_the_launcher_not_made(tmp_path):
    """It writes only on a failure, so a healthy run leaves no folder: the check looks where the folder would be
    made (its nearest existing folder) and makes nothing, and leaves that folder as it found it."""
    prefix = str(tmp_path / "fr" / "deep" / "rec")
    n, s = launch_settings(_rank, 2, (), None, {"profiler_plugin": "flightrec", "flightrec_file": prefix})
    assert (n, s.flightrec_file) == (2, prefix)
    assert list(tmp_path.iterdir()) == []


def test_an_inspector_folder_where_no_file_can_be_written_fails_in_the_launcher(tmp_path, monkeypatch):
    """Before: each rank's inspector init failed after the launch. Its setting is a folder, not a prefix."""
    (tmp_path / "f").write_text("")
    folder = str(tmp_path / "f" / "ins")
    with pytest.raises(slicetrace.errors.ConfigError) as e:
        slicetrace.launch(_rank, 2, profiler_plugin="inspector", inspector_dump_dir=folder)
    assert str(e.value) == (f"inspector_dump_dir={folder!r}: cannot write files in {str(tmp_path / 'f')!r} "
                            f"(Not a directory); give a writable folder")
    monkeypatch.setenv("SLICETRACE_INSPECTOR_DUMP_DIR", folder)
    with pytest.raises(slicetrace.errors.ConfigError, match=r"^SLICETRACE_INSPECTOR_DUMP_DIR='"):
        slicetrace.launch(_rank, 2, profiler_plugin="inspector")


def test_an_unset_inspector_folder_is_named_as_its_default_in_the_launcher(tmp_path, monkeypatch):
    """Unset, the folder is NCCL's default in the working directory: the error says so (it named the setting as if
    given that value)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    monkeypatch.delenv("SLICETRACE_INSPECTOR_DUMP_DIR", raising=False)
    (tmp_path / "nccl-inspector-unknown-jobid").write_text("")      # a file where the folder would be
    with pytest.raises(slicetrace.errors.ConfigError) as e:
        slicetrace.launch(_rank, 2, profiler_plugin="inspector")
    assert str(e.value) == ("inspector_dump_dir (SLICETRACE_INSPECTOR_DUMP_DIR) unset: its default folder "
                            f"'nccl-inspector-unknown-jobid': cannot write files in "
                            f"{str(tmp_path / 'nccl-inspector-unknown-jobid')!r} (Not a directory); give a writable "
                            f"folder")
