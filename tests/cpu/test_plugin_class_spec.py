"""profiler_plugin=<a plugin class>: launch()'s ranks, spawned, load it by its 'module:qualname' spec, from a
package module or from the script that called launch()."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import slicetrace
from slicetrace.errors import PluginError
from tests.helpers.plugins import CtorFails, NoopPlugin

pytestmark = pytest.mark.usefixtures("sigint_on")   # tests/cpu/conftest.py


def _plugins(comm):
    return comm.settings.profiler_plugin, comm.profiler_plugins


def test_launch_ranks_load_a_plugin_given_as_a_class():
    """Before: "profiler_plugin=<class 'tests.helpers.plugins.NoopPlugin'> (type type) is not accepted"."""
    res = slicetrace.launch(_plugins, 2, profiler_plugin=NoopPlugin, timeout_s=20, join_timeout_s=120)
    assert res == [("tests.helpers.plugins:NoopPlugin", ["noop"])] * 2


def test_a_plugin_class_that_fails_to_construct_fails_in_the_launcher_as_its_spec_would():
    with pytest.raises(PluginError, match=r"^profiler_plugin item 'tests.helpers.plugins:CtorFails': ValueError "
                                          r"from .*: needs a license file"):
        slicetrace.launch(_plugins, 2, profiler_plugin=CtorFails, timeout_s=20, join_timeout_s=120)


SCRIPT = '''
    import slicetrace
    from tests.helpers.plugins import NoopPlugin

    class MyPlugin(NoopPlugin):     # defined in the script, at its top level
        name = "mine"

    def work(comm):
        return comm.settings.profiler_plugin, comm.profiler_plugins

    if __name__ == "__main__":
        print(slicetrace.launch(work, 2, profiler_plugin=MyPlugin, timeout_s=20, join_timeout_s=100))
'''


def test_a_plugin_class_defined_in_the_launching_script_reaches_the_spawned_ranks(tmp_path):
    (tmp_path / "run.py").write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("SLICETRACE_PROFILER_PLUGIN", None)
    p = subprocess.run([sys.executable, str(tmp_path / "run.py")], capture_output=True, text=True, timeout=150,
                       env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str([("__main__:MyPlugin", ["mine"])] * 2)
