"""What a new user met on a first hour with `slicetrace bench`: output that says what ran."""
from slicetrace.cli.main import main


def test_a_plugin_that_failed_in_init_is_said_in_the_header(monkeypatch, capfd):
    """Its init raised on every rank: the header said 'profiling on' as if it recorded."""
    monkeypatch.setenv("SLICETRACE_PROFILER_PLUGIN", "tests.helpers.plugins:InitFails")
    assert main(["bench", "-b", "4K", "-e", "4K", "-n", "1", "-w", "0", "--ranks", "1"]) == 0
    head = capfd.readouterr().out.splitlines()[0]
    assert head.endswith("profiling on (1 of 1 plugin(s) failed in init and were unloaded: nothing is recorded)")
    monkeypatch.setenv("SLICETRACE_PROFILER_PLUGIN", "tests.helpers.plugins:InitFails,tests.helpers.plugins:NoopPlugin")
    assert main(["bench", "-b", "4K", "-e", "4K", "-n", "1", "-w", "0", "--ranks", "1"]) == 0
    assert capfd.readouterr().out.splitlines()[0].endswith("profiling on (1 of 2 plugin(s) failed in init and were "
                                                           "unloaded)")
