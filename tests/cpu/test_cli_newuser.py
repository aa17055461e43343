"""What a new user met on a first hour with `slicetrace bench`: output that says what ran."""
from slicetrace.cli.main import main


def test_a_plugin_that_failed_in_init_is_said_in_the_header(monkeypatch, capfd):
    """Its init raised on every rank: the header said 'profiling on' as if it recorded."""
    monkeypatch.setenv("SLICETRACE_PROFILER_PLUGIN", "tests.helpers.plugins:InitFails")
    assert main(["bench", "-b", "4K", "-e", "4K", "-n", "1", "-w", "0", "--ranks", "1"]) == 0
    head = capfd.readouterr().out.splitlines()[0]
    assert head.endswith("profiling off (1 of 1 plugin failed in init and was unloaded)")
    monkeypatch.setenv("SLICETRACE_PROFILER_PLUGIN", "tests.helpers.plugins:InitFails,tests.helpers.plugins:NoopPlugin")
    assert main(["bench", "-b", "4K", "-e", "4K", "-n", "1", "-w", "0", "--ranks", "1"]) == 0
    assert capfd.readouterr().out.splitlines()[0].endswith("profiling on (1 of 2 plugins failed in init and was "
                                                           "unloaded)")


def test_the_json_lists_only_the_plugins_that_recorded(monkeypatch, tmp_path, capfd):
    """Every plugin failed in init: the document listed them under "plugins", with "main_profiled": true."""
    import json
    monkeypatch.setenv("SLICETRACE_PROFILER_PLUGIN", "tests.helpers.plugins:InitFails")
    out = tmp_path / "b.json"
    assert main(["bench", "-b", "4K", "-e", "4K", "-n", "1", "-w", "0", "--ranks", "1", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["profiling"] == {
        "plugins": [], "event_mask": None, "unloaded_plugins": ["init_fails"],
        "main_profiled": False}
    monkeypatch.setenv("SLICETRACE_PROFILER_PLUGIN", "tests.helpers.plugins:InitFails,tests.helpers.plugins:NoopPlugin")
    assert main(["bench", "-b", "4K", "-e", "4K", "-n", "1", "-w", "0", "--ranks", "2", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["profiling"] == {
        "plugins": ["noop"], "event_mask": None,
        "unloaded_plugins": ["init_fails"], "main_profiled": True}
