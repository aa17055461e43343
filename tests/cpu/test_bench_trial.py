"""What a user trial of `slicetrace bench` found: a trace variable set without the plugin that writes it."""
import pytest

from slicetrace.cli.main import main


@pytest.mark.parametrize("plugins", [None, "linkstats"])
def test_a_dump_file_without_the_example_plugin_says_no_trace_is_written(tmp_path, capfd, monkeypatch, plugins):
    """SLICETRACE_PROFILE_DUMP_FILE alone (the example plugin not loaded) ran, wrote no trace and said nothing."""
    monkeypatch.setenv("SLICETRACE_PROFILE_DUMP_FILE", str(tmp_path / "tr" / "run"))
    monkeypatch.setenv("SLICETRACE_LINKSTATS_FILE", str(tmp_path / "ls"))
    if plugins:
        monkeypatch.setenv("SLICETRACE_PROFILER_PLUGIN", plugins)
    assert main(["bench", "-b", "8", "-e", "64", "-n", "1", "-w", "0"]) == 0
    out = capfd.readouterr().out
    loaded = "SLICETRACE_PROFILER_PLUGIN='linkstats'" if plugins else \
        "no profiler plugin (SLICETRACE_PROFILER_PLUGIN unset)"
    assert (f"# SLICETRACE_PROFILE_DUMP_FILE='{tmp_path}/tr/run' is set, but this run loads {loaded}, not the "
            f"example plugin that writes its files, so none are written: add --trace DIR or --profile, or add "
            f"example to SLICETRACE_PROFILER_PLUGIN\n") in out, out
    assert ("SLICETRACE_LINKSTATS_FILE" in out) == (plugins is None)      # linkstats loaded: its file is written
    assert not (tmp_path / "tr").exists()
    assert bool(list(tmp_path.glob("ls_*.prom"))) == (plugins == "linkstats")
