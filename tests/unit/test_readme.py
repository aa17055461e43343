"""The README against the code: its variable table against config.py's, its commands against the CLI's parsers.

test_config.py checks each row's keyword and a few ranges; these check the other direction too (nothing listed
that config does not read) and the command lines a user copies.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from slicetrace import config
from slicetrace.cli import table
from slicetrace.cli.main import main

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
POOL_ROW = "SLICETRACE_PROFILE_<TYPE>_POOL_SIZE"


def _section(title: str) -> str:
    """The README's section whose heading contains `title`, up to the next heading."""
    head = re.search(rf"^## .*{re.escape(title)}.*$", README, re.M)
    assert head, f"no section heading with {title!r}"
    end = README.find("\n## ", head.end())
    return README[head.start():end if end > 0 else len(README)]


def _table_rows() -> dict[str, str]:
    """variable name -> its row of the README's table (a row naming several variables gives each)."""
    rows = {}
    for line in _section("Environment variables").splitlines():
        if line.startswith("| `"):
            for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
                rows[name] = line
    return rows


def _help(*argv: str, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def _options(help_text: str) -> list[set[str]]:
    """Each option of the help's list as the set of its spellings ({'-b', '--minbytes'}), -h left out."""
    opts = [set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", m))
            for m in re.findall(r"^  (-.*?)(?:  |$)", help_text.split("\noptions:")[1], re.M)]
    return [o for o in opts if "-h" not in o]


def test_the_table_lists_every_variable_config_reads_and_nothing_else():
    read = {v.name for v in config.VARIABLES} | set(config.DIST_VARIABLES) | {POOL_ROW, "TMPDIR"}  # TMPDIR: temp_dir()
    listed = set(_table_rows())
    assert not read - listed, f"read by config.py but not in the README's table: {sorted(read - listed)}"
    assert not listed - read, f"in the README's table but not read by config.py: {sorted(listed - read)}"
    pools = set(re.findall(r"\b[A-Z][A-Z0-9_]+[A-Z0-9]\b", _table_rows()[POOL_ROW].split("TYPE is ")[1]))
    assert pools == set(config.POOL_NAMES)


def test_each_setting_row_gives_its_default_or_what_unset_means():
    rows = _table_rows()
    for v in config.VARIABLES:
        assert re.search(r"\bdefault\b|\bunset\b", rows[v.name].split("|", 3)[3]), v.name


def test_every_variable_the_readme_names_exists():
    known = {v.name for v in config.VARIABLES} | set(config.POOL_VARIABLES)
    named = set(re.findall(r"\bSLICETRACE_[A-Z0-9_]*[A-Z0-9]\b", README))
    assert not named - known, f"the README names variables config.py does not read: {sorted(named - known)}"


def test_every_subcommand_and_flag_is_described(capsys):
    top = _help(capsys=capsys)
    subs = re.search(r"\{([a-z,]+)\}", top).group(1).split(",")
    assert subs == ["bench", "config", "report", "convert", "diff"]
    for sub in subs:
        assert f"slicetrace {sub}" in README, sub
        section = README if sub == "config" else _section(f"`slicetrace {sub}`")
        for spellings in _options(_help(sub, capsys=capsys)):
            assert any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", section) for o in spellings), (sub, spellings)


def test_the_readme_commands_use_flags_their_subcommand_has(capsys):
    blocks = re.findall(r"^```bash\n(.*?)^```", README, re.M | re.S)
    seen = 0
    for line in (ln for b in blocks for ln in b.splitlines()):
        for cmd in re.findall(r"slicetrace (\w+)([^|#&;]*)", line):
            sub, rest = cmd
            opts = set().union(*_options(_help(sub, capsys=capsys)))
            for tok in shlex.split(rest):
                if tok.startswith("-") and tok != "-":
                    assert tok.split("=")[0] in opts, f"{line!r}: {sub} has no {tok}"
            seen += 1
    assert seen >= 6


def test_the_sample_bench_output_has_the_table_header_bench_prints():
    sample = _section("First run").split("```text\n")[1]
    assert table.HEADER in sample and table.UNITS.rstrip() + "\n" in sample   # an editor strips trailing blanks


def test_bench_exit_statuses_are_those_its_help_gives(capsys):
    epilog = _help("bench", capsys=capsys).split("exit status:")[1]
    codes = set(re.findall(r"\b(\d+)\s+[a-z]", epilog))
    line = README[README.index("\nExit status"):].split("\n\n")[0]
    assert codes == {"0", "1", "2", "130", "143"} and codes == set(re.findall(r"\b(\d+) [a-z(]", line))


def test_the_readme_plugin_is_a_complete_plugin_and_counts_sent_bytes(capsys):
    import numpy as np
    from slicetrace.events import abi
    from slicetrace.events.plugin import LoadedPlugin
    code = next(b for b in re.findall(r"^```python\n(.*?)^```", README, re.M | re.S) if "class StepBytes" in b)
    ns: dict = {}
    exec(compile(code, "README.md", "exec"), ns)
    lp = LoadedPlugin(ns["StepBytes"](), "stepbytes:StepBytes")
    lp.init(abi.CommInfo(comm_hash=1, comm_name="c", n_nodes=1, n_ranks=2, rank=1))
    assert lp.version == abi.NATIVE_VERSION and lp.mask == abi.EventType.KERNEL_STEP
    recs = np.zeros(3, abi.KERNEL_STEP_DTYPE)
    recs["is_send"], recs["size"] = [1, 0, 1], [4096, 999, 512]
    assert lp.kernel_step_batch(lp.ctx, recs) == 3
    lp.finalize()
    assert capsys.readouterr().out == "rank 1: 4608 B sent in KernelSteps\n"
