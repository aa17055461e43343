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


def _bench(env: dict, *args: str):
    """In a child: without the refusal, -N 0 would run for good (the timeout then fails the test)."""
    import os
    import subprocess
    import sys
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLICETRACE_")}, **env,
           "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "slicetrace", "bench", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_run_without_end_is_refused_with_trace_files(tmp_path):
    """-N 0 --trace grew each rank's file without bound (367 MB in 10 minutes in a user trial)."""
    p = _bench({}, "-N", "0", "--trace", str(tmp_path / "t"))
    assert p.returncode == 2 and p.stderr.startswith(
        f"slicetrace: error: -N 0 with --trace '{tmp_path / 't'}': a run without end would grow each rank's trace "
        f"file without bound; give -N a count of cycles, or ")
    assert "linkstats" in p.stderr and not (tmp_path / "t").exists()       # refused before the folder is made
    p = _bench({"SLICETRACE_PROFILER_PLUGIN": "example", "SLICETRACE_PROFILE_DUMP_FILE": str(tmp_path / "e" / "run")},
               "-N", "0")
    assert p.returncode == 2 and p.stderr.startswith(
        f"slicetrace: error: -N 0 with SLICETRACE_PROFILE_DUMP_FILE='{tmp_path / 'e' / 'run'}' (the example "
        f"plugin's trace files): ")
