import logging
import math
import os
import re
import secrets
from pathlib import Path

import pytest

from slicetrace import config, config_values
from slicetrace.config import POOL_VARIABLES, VARIABLES, Settings, describe, dist_env
from slicetrace.errors import ConfigError


def test_defaults_mirror_nccl():
    s = Settings()
    assert s.buffsize == 4 << 20 and s.step_bytes == 512 << 10 and s.backend == "cpu"


def test_env_is_parsed_and_arguments_win():
    env = {"SLICETRACE_BACKEND": "null", "SLICETRACE_BUFFSIZE": "0x100000", "SLICETRACE_PROFILE_COLL_POOL_SIZE": "7"}
    s = Settings.from_env(env)
    assert (s.backend, s.buffsize, s.pool_sizes["COLL"]) == ("null", 1 << 20, 7)
    assert Settings.from_env(env, backend="cpu").backend == "cpu"


@pytest.mark.parametrize("kw,msg", [
    ({"backend": "tpu"}, r"^backend='tpu' is not one of \('null', 'cpu', 'cuda'\)$"),
    ({"ring_slots": 100}, r"^ring_slots=100 must be a power of two in 64\.\.16777216 \(2\*\*24\)$"),
    ({"sample_rate": 0}, r"^sample_rate=0 must be in 1\.\.255"),
    ({"nchannels": 65}, r"^nchannels=65 must be in 0\.\.64"),
    ({"buffsize": 1000}, r"^buffsize=1000 must be"),
    ({"op_sample_rate": 0}, r"^op_sample_rate=0 must be in 1\.\.1000000"),
    ({"profile_min_bytes": -1}, r"^profile_min_bytes=-1 must be >= 0 bytes"),
])
def test_bad_values_name_parameter_value_and_accepted(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        Settings(**kw)


def test_unparsable_env_names_the_variable():
    with pytest.raises(ConfigError, match=r"SLICETRACE_TIMEOUT='soon' cannot be parsed"):
        Settings.from_env({"SLICETRACE_TIMEOUT": "soon"})


def test_a_parsable_but_invalid_env_value_names_the_variable_too():
    with pytest.raises(ConfigError, match=r"SLICETRACE_STAMP_RING_SLOTS='100': ring_slots=100 must be a power of two"):
        Settings.from_env({"SLICETRACE_STAMP_RING_SLOTS": "100"})
    with pytest.raises(ConfigError, match=r"^ring_slots=100 must be"):      # an argument: no variable to name
        Settings.from_env({"SLICETRACE_STAMP_RING_SLOTS": "4096"}, ring_slots=100)


def test_unknown_override_is_refused():
    with pytest.raises(ConfigError, match="unknown setting"):
        Settings.from_env({}, colour="red")


def test_dist_env_and_describe():
    d = dist_env({"RANK": "3", "WORLD_SIZE": "8", "MASTER_ADDR": "h", "MASTER_PORT": "29500"})
    assert (d.rank, d.world_size, d.local_rank, d.master_port) == (3, 8, None, 29500)
    with pytest.raises(ConfigError, match="RANK='x' must be an integer"):
        dist_env({"RANK": "x"})
    rows = describe(Settings(), {})
    assert {r[0] for r in rows} >= {v.name for v in VARIABLES}
    assert all(r[1] == v.attr for r, v in zip(rows, VARIABLES))          # each with its init() keyword


def test_an_unknown_keyword_named_as_its_variable_gets_the_keyword():
    """init(kernel_step_sample_rate=4) listed 25 names without saying which one was meant."""
    with pytest.raises(ConfigError, match=r"^unknown setting\(s\) \['kernel_step_sample_rate', 'timeout'\] \(did you mean "
                                          r"sample_rate for kernel_step_sample_rate, timeout_s for timeout\?\); known: "):
        Settings.from_env({}, kernel_step_sample_rate=4, timeout=3)


def test_config_command_prints_every_variable(capsys, monkeypatch):
    from slicetrace.cli.main import main
    monkeypatch.setenv("SLICETRACE_TIMEOUT", "12.5")
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert all(v.name in out for v in VARIABLES)
    assert "SLICETRACE_TIMEOUT" in out and "12.5" in out and "env=12.5" in out


def test_profile_min_bytes_takes_sizes_with_binary_suffixes():
    parse = lambda v: Settings.from_env({"SLICETRACE_PROFILE_MIN_BYTES": v}).profile_min_bytes   # noqa: E731
    assert [parse(v) for v in ("64K", "64kb", "1M", "4096", "0x1B")] == [65536, 65536, 1 << 20, 4096, 27]
    with pytest.raises(ConfigError, match=r"^SLICETRACE_PROFILE_MIN_BYTES='1.5M' cannot be parsed: expected bytes: an "
                                          r"integer, or one with a binary suffix K, M or G"):
        parse("1.5M")
    with pytest.raises(ConfigError, match=r"^SLICETRACE_PROFILE_MIN_BYTES='-1K': profile_min_bytes=-1024 must be >= 0"):
        parse("-1K")


# ---- time settings: finite, in a stated range (an infinite timeout made launch() wait forever) ----

@pytest.mark.parametrize("name", ["timeout_s", "linkstats_interval_s", "clock_resync_s"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 0, 0.0, -1, 86400.5, 1e400])
def test_time_settings_must_be_finite_and_in_range(name, value):
    with pytest.raises(ConfigError) as e:
        Settings(**{name: value})
    assert str(e.value) == f"{name}={value!r} must be > 0 seconds and <= 86400"


@pytest.mark.parametrize("var", ["SLICETRACE_TIMEOUT", "SLICETRACE_LINKSTATS_INTERVAL_S", "SLICETRACE_CLOCK_RESYNC_S"])
@pytest.mark.parametrize("raw", ["inf", "1e400", "nan", "-1", "1_0", "\u0663", "0x10"])
def test_time_variables_are_decimal_seconds(var, raw):
    """float() took '1_0' as 10 and 'inf' / '1e400' (refused later, by range); decimals only, as the README says."""
    with pytest.raises(ConfigError, match=rf"^{var}='{raw}' cannot be parsed: expected a number of seconds, e.g. 60 "
                                          rf"or 2.5, > 0 seconds and <= 86400$"):
        Settings.from_env({var: raw})


@pytest.mark.parametrize("var", ["SLICETRACE_TIMEOUT", "SLICETRACE_LINKSTATS_INTERVAL_S", "SLICETRACE_CLOCK_RESYNC_S"])
@pytest.mark.parametrize("raw", ["0", "0.0", "86400.5"])
def test_time_variables_must_be_in_range(var, raw):
    with pytest.raises(ConfigError, match=rf"^{var}='{raw}': \w+=\S+ must be > 0 seconds and <= 86400$"):
        Settings.from_env({var: raw})
    attr = next(v.attr for v in VARIABLES if v.name == var)
    assert getattr(Settings.from_env({var: " 2.5 "}), attr) == 2.5


def test_time_settings_take_ints_and_the_bounds():
    s = Settings(timeout_s=86400, linkstats_interval_s=0.001, clock_resync_s=3)
    assert (s.timeout_s, s.linkstats_interval_s, s.clock_resync_s) == (86400, 0.001, 3)


def test_bench_refuses_an_infinite_timeout(capsys):
    from slicetrace.cli.main import main
    assert main(["bench", "-T", "inf", "-b", "1K", "-e", "1K"]) == 2        # before any rank starts
    err = capsys.readouterr().err                    # the flag's own check, or Settings' (timeout_s=inf)
    assert re.search(r"(-T|timeout_s=)\s?inf must be > 0 seconds and <= 86400", err), err


# ---- types: each field says its type and what it accepts ----

@pytest.mark.parametrize("kw,msg", [
    ({"timeout_s": "5"}, "timeout_s='5' (type str) is not accepted: timeout_s must be a number (int or float, not a "
                         "bool), > 0 seconds and <= 86400"),
    ({"timeout_s": True}, "timeout_s=True (type bool) is not accepted: timeout_s must be a number"),
    ({"debug": 5}, "debug=5 (type int) is not accepted: debug must be a str, one of ('WARN', 'INFO', 'DEBUG', "
                   "'WARNING', 'ERROR', 'CRITICAL') (any case)"),
    ({"assert_warm": "no"}, "assert_warm='no' (type str) is not accepted: assert_warm must be a bool (True or False)"),
    ({"assert_warm": 1}, "assert_warm=1 (type int) is not accepted: assert_warm must be a bool"),
    ({"nchannels": True}, "nchannels=True (type bool) is not accepted: nchannels must be an int (not a bool), "
                          "in 0..64 (0 = backend default)"),
    ({"nchannels": 2.5}, "nchannels=2.5 (type float) is not accepted: nchannels must be an int (not a bool), in 0..64"),
    ({"buffsize": 4194304.0}, "buffsize=4194304.0 (type float) is not accepted: buffsize must be an int (not a "
                              "bool), >= 32768 and a multiple of 4096"),
    ({"profiler_plugin": 5}, "profiler_plugin=5 (type int) is not accepted: profiler_plugin must be a str or None"),
    ({"profile_event_mask": "Coll"}, "profile_event_mask='Coll' (type str) is not accepted: profile_event_mask must "
                                     "be an int (not a bool) or None, in 0..2**32-1"),
    ({"backend": None}, "backend=None (type NoneType) is not accepted: backend must be a str, one of ('null', 'cpu', "
                        "'cuda')"),
    ({"cache_dir": Path("/tmp")}, "cache_dir=PosixPath('/tmp') (type PosixPath) is not accepted: cache_dir must be a "
                                  "str"),
    ({"pool_sizes": 5}, "pool_sizes=5 (type int) is not accepted: pool_sizes must be a dict of pool name -> int >= 1; "
                        "names: GROUP_API, COLL_API"),
    ({"pool_sizes": {"COLL": 2.0}}, "pool_sizes['COLL']=2.0 must be an int >= 1 (as SLICETRACE_PROFILE_COLL_POOL_SIZE)"),
    ({"pool_sizes": {"COLL": 0}}, "pool_sizes['COLL']=0 must be an int >= 1"),
    ({"pool_sizes": {"COL": 4}}, "pool_sizes: pool 'COL' is not one of ('GROUP_API', "),
])
def test_wrong_types_name_field_value_type_and_accepted(kw, msg):
    with pytest.raises(ConfigError) as e:
        Settings(**kw)
    assert str(e.value).startswith(msg)


def test_every_field_is_type_checked():
    """A field added without a type rule would fail here (and in every Settings())."""
    for f in config.fields(Settings):
        if f.name != "pool_sizes":
            assert f.type in config.TYPES, f.name
    assert set(config.RULES) <= {f.name for f in config.fields(Settings)}


def test_right_types_are_kept():
    import numpy as np
    s = Settings(nchannels=np.int64(2), timeout_s=np.float64(1.5), assert_warm=True, pool_sizes={"COLL": 7},
                 profile_event_mask=0x10046)
    assert (s.nchannels, s.timeout_s, s.assert_warm, s.pool_sizes["COLL"]) == (2, 1.5, True, 7)


def test_a_failed_segment_creation_leaves_no_name_behind():
    from slicetrace.backend.segment import Segment
    name = f"st_test_{secrets.token_hex(4)}"
    with pytest.raises(TypeError):
        Segment(name, 4194304.0, create=True)           # ftruncate refuses a float size after shm_open
    assert not os.path.exists(f"/dev/shm/{name}")


# ---- environment parse errors: variable, value and the accepted format ----

def _parsed(var):
    return var.parse is not str


@pytest.mark.parametrize("var", [v for v in VARIABLES if _parsed(v)], ids=lambda v: v.name)
def test_every_parse_error_names_variable_value_and_format(var):
    with pytest.raises(ConfigError) as e:
        Settings.from_env({var.name: "?x"})
    why = (" ('?x' is not an event type, which are " if var.attr == "profile_event_mask" else
           " ('?x' is not a decimal (no leading zero) or 0x hex integer)" if var.parse is config_values.as_int
           else "")
    assert str(e.value).startswith(f"{var.name}='?x' cannot be parsed{why}")
    rule = config.RULES.get(var.attr)                  # and the range, where there is one
    assert str(e.value).endswith(f": expected {config_values.FORMATS[var.parse]}"
                                 + (f", {rule[1]}" if rule else ""))


@pytest.mark.parametrize("raw,msg", [
    ("SLICETRACE_ASSERT_WARM=maybe", "SLICETRACE_ASSERT_WARM='maybe' cannot be parsed: expected one of "
                                     "0/1/true/false/yes/no/on/off"),
    ("SLICETRACE_BUFFSIZE=4Q", "SLICETRACE_BUFFSIZE='4Q' cannot be parsed: expected bytes: an integer, or one with a "
                               "binary suffix K, M or G"),
    ("SLICETRACE_PROFILE_EVENT_MASK=Col", "SLICETRACE_PROFILE_EVENT_MASK='Col' cannot be parsed ('Col' is not an "
                                          "event type, which are GROUP, COLL,"),
    ("SLICETRACE_TIMEOUT=soon", "SLICETRACE_TIMEOUT='soon' cannot be parsed: expected a number of seconds"),
    ("SLICETRACE_NCHANNELS=2.5", "SLICETRACE_NCHANNELS='2.5' cannot be parsed ('2.5' is not a decimal (no leading "
                                 "zero) or 0x hex integer): expected an integer, decimal or 0x hex, in 0..64"),
    ("SLICETRACE_PROFILE_COLL_POOL_SIZE=x", "SLICETRACE_PROFILE_COLL_POOL_SIZE='x' must be an integer >= 1"),
    ("SLICETRACE_PROFILE_COLL_POOL_SIZE=0", "SLICETRACE_PROFILE_COLL_POOL_SIZE='0' must be an integer >= 1"),
])
def test_parse_errors_say_what_is_accepted(raw, msg):
    name, value = raw.split("=", 1)
    with pytest.raises(ConfigError) as e:
        Settings.from_env({name: value})
    assert str(e.value).startswith(msg)


def test_sizes_take_binary_suffixes_everywhere():
    s = Settings.from_env({"SLICETRACE_BUFFSIZE": "4M", "SLICETRACE_P2P_CHUNKSIZE": "256K"})
    assert (s.buffsize, s.p2p_chunksize) == (4 << 20, 256 << 10)
    with pytest.raises(ConfigError, match=r"^SLICETRACE_BUFFSIZE='1K': buffsize=1024 must be >= 32768 and a multiple"):
        Settings.from_env({"SLICETRACE_BUFFSIZE": "1K"})


def test_event_mask_takes_decimal_hex_and_type_names():
    assert Settings.from_env({"SLICETRACE_PROFILE_EVENT_MASK": "0x10046"}).profile_event_mask == 65606
    assert Settings.from_env({"SLICETRACE_PROFILE_EVENT_MASK": "65606"}).profile_event_mask == 65606
    for names in ("Coll|P2p|KernelCh|KernelStep", " coll , p2p,kernel_ch|KERNEL_STEP "):
        assert Settings.from_env({"SLICETRACE_PROFILE_EVENT_MASK": names}).profile_event_mask == 65606
    assert Settings.from_env({"SLICETRACE_PROFILE_EVENT_MASK": "ProxyCtrl"}).profile_event_mask == 1 << 5
    with pytest.raises(ConfigError, match=r"^SLICETRACE_PROFILE_EVENT_MASK='Coll\|KernelStepz' cannot be parsed "
                                          r"\('KernelStepz' is not an event type, which are GROUP, COLL, .*, KERNEL_STEP\): "
                                          r"expected an integer"):
        Settings.from_env({"SLICETRACE_PROFILE_EVENT_MASK": "Coll|KernelStepz"})
    with pytest.raises(ConfigError, match=r"^SLICETRACE_PROFILE_EVENT_MASK='0x100000000': profile_event_mask="
                                          r"4294967296 must be in 0\.\.2\*\*32-1$"):
        Settings.from_env({"SLICETRACE_PROFILE_EVENT_MASK": "0x100000000"})


@pytest.mark.parametrize("env,msg", [
    ({"RANK": "x"}, "RANK='x' must be an integer >= 0"),
    ({"RANK": "-1"}, "RANK='-1' must be an integer >= 0"),
    ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK='3' must be an integer in 0..1 (WORLD_SIZE=2)"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' must be an integer >= 1"),
    ({"LOCAL_RANK": "-2"}, "LOCAL_RANK='-2' must be an integer >= 0"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT='70000' must be an integer in 1..65535"),
    # port 0 lets rank 0's store pick a port no other rank knows; an empty address names no host
    ({"MASTER_PORT": "0"}, "MASTER_PORT='0' must be an integer in 1..65535"),
    ({"MASTER_ADDR": ""}, "MASTER_ADDR='' must be the host name or IP address of rank 0's host"),
    ({"MASTER_ADDR": " "}, "MASTER_ADDR=' ' must be the host name or IP address of rank 0's host"),
    # decimal only, as torchrun writes them (int() also took these)
    ({"RANK": "+1"}, "RANK='+1' must be an integer >= 0"),
    ({"RANK": " 1"}, "RANK=' 1' must be an integer >= 0"),
    ({"WORLD_SIZE": "1_0"}, "WORLD_SIZE='1_0' must be an integer >= 1"),
    ({"MASTER_PORT": "\u0662\u0669\u0665\u0660\u0660"}, "MASTER_PORT='\u0662\u0669\u0665\u0660\u0660' must be an integer in "
                                                   "1..65535"),
])
def test_torchrun_variables_are_checked_by_name(env, msg):
    with pytest.raises(ConfigError) as e:
        dist_env(env)
    assert str(e.value) == msg


def test_torchrun_variables_are_read_only_when_asked_for():
    """init() with rank and world_size given (launch()'s ranks, the CLI's) reads no RANK/WORLD_SIZE, and one with a
    store given reads no MASTER_*: a bad value there is not its business."""
    bad = {"RANK": "", "WORLD_SIZE": "x", "LOCAL_RANK": "-1", "MASTER_ADDR": "", "MASTER_PORT": "auto"}
    d = dist_env(bad, ranks=False, master=False)
    assert (d.rank, d.world_size, d.local_rank, d.master_addr, d.master_port, d.agent_store) == (None,) * 5 + (False,)
    d = dist_env({**bad, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, master=False)
    assert (d.rank, d.world_size, d.local_rank, d.master_port) == (1, 2, 1, None)
    d = dist_env({**bad, "MASTER_ADDR": "h", "MASTER_PORT": "29500"}, ranks=False)
    assert (d.rank, d.master_addr, d.master_port, d.agent_store) == (None, "h", 29500, False)


@pytest.mark.parametrize("value,agent", [("True", True), ("False", False), ("1", False), ("true", False)])
def test_torchruns_agent_store_is_read_as_torch_reads_it(value, agent):
    """torch's env:// makes every rank a client when TORCHELASTIC_USE_AGENT_STORE == "True" exactly."""
    env = {"MASTER_ADDR": "h", "MASTER_PORT": "1", "TORCHELASTIC_USE_AGENT_STORE": value}
    assert dist_env(env).agent_store is agent
    assert dist_env(env, master=False).agent_store is False


@pytest.mark.parametrize("raw", ["0o7", "0b11", "1_0", "+3", "010", "\u0663", "3.0", "0x"])
def test_integers_are_decimal_without_a_leading_zero_or_0x_hex_as_the_readme_says(raw):
    with pytest.raises(ConfigError, match=r"^SLICETRACE_NCHANNELS=.* cannot be parsed \(.* is not a decimal \(no leading "
                                          r"zero\) or 0x hex integer\): expected an integer, decimal or 0x hex, in 0..64"):
        Settings.from_env({"SLICETRACE_NCHANNELS": raw})
    with pytest.raises(ConfigError, match=r"^SLICETRACE_PROFILE_COLL_POOL_SIZE=.* must be an integer >= 1"):
        Settings.from_env({"SLICETRACE_PROFILE_COLL_POOL_SIZE": raw})
    with pytest.raises(ConfigError, match=r"^SLICETRACE_PROFILE_EVENT_MASK=.* cannot be parsed"):
        Settings.from_env({"SLICETRACE_PROFILE_EVENT_MASK": raw})
    with pytest.raises(ConfigError, match=r"^SLICETRACE_PROFILE_MIN_BYTES=.* cannot be parsed"):
        Settings.from_env({"SLICETRACE_PROFILE_MIN_BYTES": raw + "K" if raw else raw})


def test_integers_still_take_decimal_hex_zero_and_a_sign_for_the_range_error():
    assert Settings.from_env({"SLICETRACE_NCHANNELS": " 4 "}).nchannels == 4
    assert Settings.from_env({"SLICETRACE_NCHANNELS": "0"}).nchannels == 0
    assert Settings.from_env({"SLICETRACE_NCHANNELS": "0X1f"}).nchannels == 31
    assert Settings.from_env({"SLICETRACE_PROFILE_MIN_BYTES": "0x10"}).profile_min_bytes == 16
    assert Settings.from_env({"SLICETRACE_PROFILE_MIN_BYTES": "16KB"}).profile_min_bytes == 16 << 10
    with pytest.raises(ConfigError, match=r"^SLICETRACE_NCHANNELS='-1': nchannels=-1 must be in 0\.\.64"):
        Settings.from_env({"SLICETRACE_NCHANNELS": "-1"})


def test_an_argument_beats_a_variable_it_overrides_even_one_that_would_not_parse():
    """Flags and keywords win over the environment: -T 5 with SLICETRACE_TIMEOUT=0 (or =soon) runs."""
    assert Settings.from_env({"SLICETRACE_TIMEOUT": "0"}, timeout_s=5).timeout_s == 5
    assert Settings.from_env({"SLICETRACE_TIMEOUT": "soon"}, timeout_s=5).timeout_s == 5
    with pytest.raises(ConfigError, match=r"^SLICETRACE_TIMEOUT='soon' cannot be parsed"):
        Settings.from_env({"SLICETRACE_TIMEOUT": "soon"}, timeout_s=None)      # None: no argument given


def test_env_source_names_the_variable_that_set_a_field():
    assert config.env_source("backend", {"SLICETRACE_BACKEND": "cuda"}) == "SLICETRACE_BACKEND"
    assert config.env_source("backend", {}) is None


# ---- unknown SLICETRACE_* variables: a warning with the closest known name, never an error ----

def test_misspelled_variables_are_reported_with_the_closest_name(caplog, monkeypatch):
    monkeypatch.setattr(config, "_warned", set())
    env = {"SLICETRACE_TIMEOUTS": "5", "SLICETRACE_NCHANNEL": "4", "SLICETRACE_XYZZY": "1", "SLICETRACE_TIMEOUT": "7"}
    with caplog.at_level(logging.WARNING, logger="slicetrace"):
        s = Settings.from_env(env)
        Settings.from_env(env)                           # once per process, not per call
    assert (s.timeout_s, s.nchannels) == (7.0, 0)
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == [
        "slicetrace: SLICETRACE_NCHANNEL='4' is not a slicetrace variable and is ignored; did you mean "
        "SLICETRACE_NCHANNELS?",
        "slicetrace: SLICETRACE_TIMEOUTS='5' is not a slicetrace variable and is ignored; did you mean "
        "SLICETRACE_TIMEOUT?",
        "slicetrace: SLICETRACE_XYZZY='1' is not a slicetrace variable and is ignored; `slicetrace config` lists "
        "them all"]


def test_a_variable_misspelt_in_case_only_is_told_its_name(caplog, monkeypatch):
    """SLICETRACE_debug got "`slicetrace config` lists them all": difflib finds nothing between 'debug' and 'DEBUG'."""
    monkeypatch.setattr(config, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="slicetrace"):
        Settings.from_env({"SLICETRACE_debug": "INFO"})
    assert [r.getMessage() for r in caplog.records] == [
        "slicetrace: SLICETRACE_debug='INFO' is not a slicetrace variable and is ignored; did you mean "
        "SLICETRACE_DEBUG?"]


def test_every_known_variable_round_trips_without_a_warning(caplog, monkeypatch):
    monkeypatch.setattr(config, "_warned", set())
    d = Settings()
    raw = {a: "" if getattr(d, a) is None else str(getattr(d, a)) for a in (v.attr for v in VARIABLES)}
    env = {v.name: "65606" if v.attr == "profile_event_mask" else raw[v.attr] for v in VARIABLES}
    env.update({var: str(d.pool_sizes[n]) for n, var in zip(config.POOL_NAMES, POOL_VARIABLES)})
    with caplog.at_level(logging.WARNING, logger="slicetrace"):
        s = Settings.from_env(env)
    assert caplog.records == []
    assert s == d.with_(profile_event_mask=65606)


# a valid value other than the default for every variable: (what the variable says, the field's value)
NON_DEFAULT = {
    "backend": ("null", "null"), "nchannels": ("5", 5), "buffsize": ("128K", 131072),
    "p2p_chunksize": ("8K", 8192), "nthreads": ("256", 256), "timeout_s": ("2.5", 2.5),
    "ring_slots": ("0x100", 256), "sample_rate": ("3", 3), "op_sample_rate": ("7", 7),
    "profile_min_bytes": ("64K", 65536), "drain_interval_us": ("250", 250), "profiler_plugin": ("linkstats", "linkstats"),
    "profile_event_mask": ("Coll|KernelStep", 2 | 1 << 16), "profile_dump_file": ("/x/trace", "/x/trace"),
    "linkstats_file": ("/x/links", "/x/links"), "linkstats_interval_s": ("0.5", 0.5),
    "inspector_dump_dir": ("/x/ins", "/x/ins"), "inspector_dump_interval_us": ("0x10", 16),
    "inspector_verbose": ("on", True), "flightrec_ops": ("8", 8), "flightrec_max_records": ("0x1000", 4096),
    "flightrec_dump": ("Always", "always"), "flightrec_file": ("/x/fr", "/x/fr"),
    "plugin_max_failures": ("3", 3), "cpu_reclaim": ("on", "on"), "cpu_pool": ("1M", 1 << 20), "cpu_wait": ("futex", "futex"),
    "cpu_bind": ("off", "off"), "cache_dir": ("/x/cache", "/x/cache"), "assert_warm": ("yes", True),
    "clock_resync_s": ("4", 4.0), "debug": ("INFO", "INFO"),
}


def test_every_known_variable_sets_its_field(caplog, monkeypatch):
    """Each variable set to a value other than its default reaches its field: one that from_env parsed but did
    not store would leave the default, which the round trip above cannot tell from the value."""
    monkeypatch.setattr(config, "_warned", set())
    d = Settings()
    assert set(NON_DEFAULT) == {v.attr for v in VARIABLES}        # a new variable needs a value here
    assert [a for a, (_, want) in NON_DEFAULT.items() if getattr(d, a) == want] == []
    env = {v.name: NON_DEFAULT[v.attr][0] for v in VARIABLES}
    pools = {n: d.pool_sizes[n] + 1 + i for i, n in enumerate(config.POOL_NAMES)}
    env.update({var: str(pools[n]) for n, var in zip(config.POOL_NAMES, POOL_VARIABLES)})
    with caplog.at_level(logging.WARNING, logger="slicetrace"):
        s = Settings.from_env(env)
    assert caplog.records == []
    assert {a: getattr(s, a) for a in NON_DEFAULT} == {a: want for a, (_, want) in NON_DEFAULT.items()}
    assert dict(s.pool_sizes) == pools
    for v in VARIABLES:                                           # and each alone, the others at their defaults
        alone = Settings.from_env({v.name: NON_DEFAULT[v.attr][0]})
        assert alone == d.with_(**{v.attr: NON_DEFAULT[v.attr][1]}), v.name


# ---- ring slots: an upper bound, named ----

def test_ring_slots_have_an_upper_bound():
    assert Settings(ring_slots=1 << 24).ring_slots == 1 << 24
    with pytest.raises(ConfigError, match=r"^SLICETRACE_STAMP_RING_SLOTS='1099511627776': ring_slots=1099511627776 "
                                          r"must be a power of two in 64\.\.16777216"):
        Settings.from_env({"SLICETRACE_STAMP_RING_SLOTS": str(1 << 40)})
    with pytest.raises(ConfigError, match=r"^ring_slots=33554432 must be a power of two in 64\.\.16777216"):
        Settings(ring_slots=1 << 25)


# ---- the README's hand-written table ----

def test_readme_lists_every_variable_and_its_ranges():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Environment variables"):]
    section = section[:section.index("\n## ", 3)]
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(SLICETRACE_\w+)` \|.*$", section, re.M)}
    assert {v.name for v in VARIABLES} <= set(rows)
    for v in VARIABLES:                     # the keyword column: init()/launch() take the setting by that name
        assert rows[v.name].startswith(f"| `{v.name}` | `{v.attr}` |"), v.name
    for var, needle in [("SLICETRACE_TIMEOUT", "86400"), ("SLICETRACE_STAMP_RING_SLOTS", "16777216"),
                        ("SLICETRACE_NCHANNELS", "0..64"), ("SLICETRACE_BUFFSIZE", "32768"),
                        ("SLICETRACE_NTHREADS", "640"), ("SLICETRACE_DRAIN_INTERVAL_US", "10..1000000"),
                        ("SLICETRACE_PLUGIN_MAX_FAILURES", ">= 1")]:
        assert needle in rows[var], var


def test_the_event_mask_keyword_takes_type_names_as_the_variable_does():
    assert Settings.from_env({}, profile_event_mask="Coll|KernelStep").profile_event_mask == (1 << 1) | (1 << 16)
    with pytest.raises(ConfigError, match=r"^profile_event_mask='Coll\|Bogus': 'Bogus' is not an event type, which "
                                          r"are GROUP, .*; expected an integer"):
        Settings.from_env({}, profile_event_mask="Coll|Bogus")


def test_slicetrace_debug_info_reaches_stderr(capsys, monkeypatch):
    """SLICETRACE_DEBUG=INFO set our logger's level, but with no handler Python printed WARNING and up only: the
    linkstats summary at close (log.info) could never be seen."""
    import gc
    import logging
    import weakref
    from slicetrace import session
    from slicetrace.session import _log_to_stderr
    log = logging.getLogger("slicetrace")
    monkeypatch.setattr(log, "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(session, "_LOG_LIVE", weakref.WeakKeyDictionary())    # other tests' open communicators

    class Key:
        pass
    k1, k2, k3 = Key(), Key(), Key()
    level = log.level
    try:
        _log_to_stderr("info", 3, k1)
        log.info("hello %d", 7)
        log.debug("not shown")
        assert capsys.readouterr().err == "slicetrace rank 3 INFO: hello 7\n"
        assert len(log.handlers) == 1
        _log_to_stderr("WARN", 3, k2)             # a second communicator: no second handler, and it keeps INFO
        assert len(log.handlers) == 1 and log.level == logging.INFO
        _log_to_stderr("WARN", 4, k3)             # a rank of another thread: no single rank to name
        log.info("both")
        assert capsys.readouterr().err == "slicetrace INFO: both\n"
        _log_to_stderr(None, 0, k1)               # the INFO one closes: WARN
        del k3                                    # dropped without close (garbage): rank 3's alone again
        gc.collect()
        _log_to_stderr("WARN", 3, k2)
        assert log.level == logging.WARNING
        log.warning("left")
        assert capsys.readouterr().err == "slicetrace rank 3 WARNING: left\n"
    finally:
        _log_to_stderr(None, 0, k2)
        log.setLevel(level)


def test_word_variables_take_any_case_as_the_others_do():
    """SLICETRACE_CPU_RECLAIM=ON was refused while SLICETRACE_DEBUG and the boolean variables took any case."""
    s = Settings.from_env({"SLICETRACE_BACKEND": "CPU", "SLICETRACE_CPU_RECLAIM": "ON", "SLICETRACE_CPU_WAIT": " Spin",
                           "SLICETRACE_CPU_BIND": "Off"})
    assert (s.backend, s.cpu_reclaim, s.cpu_wait, s.cpu_bind) == ("cpu", "on", "spin", "off")
    with pytest.raises(ConfigError, match=r"SLICETRACE_CPU_WAIT='busy': cpu_wait='busy'"):
        Settings.from_env({"SLICETRACE_CPU_WAIT": "busy"})
    k = Settings.from_env({}, backend="CPU", cpu_wait="Spin")            # keywords too (init, launch)
    assert (k.backend, k.cpu_wait) == ("cpu", "spin")


def test_a_rank_of_launch_does_not_repeat_the_launchers_unknown_variable_warning(caplog):
    """Each rank warned again (4 warnings for a 3-rank bench); the launcher's one is enough."""
    from slicetrace.config import quiet_unknown
    env = {"SLICETRACE_NCHANELS_X": "2"}
    quiet_unknown(env)
    with caplog.at_level("WARNING", logger="slicetrace"):
        Settings.from_env(env)
    assert "SLICETRACE_NCHANELS_X" not in caplog.text


def test_a_session_logs_to_stderr_at_slicetrace_debug_info(capsys, monkeypatch):
    """The handler is installed by the communicator's session (not only by the helper the test above calls)."""
    import logging
    import weakref
    import slicetrace
    from slicetrace import session
    log = logging.getLogger("slicetrace")
    monkeypatch.setattr(log, "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(session, "_LOG_LIVE", weakref.WeakKeyDictionary())    # other tests' open communicators
    level = log.level
    try:
        c = slicetrace.init(backend="null", debug="INFO")
        log.info("from the session")
        c.close()
    finally:
        log.setLevel(level)
    assert "slicetrace rank 0 INFO: from the session" in capsys.readouterr().err


# ---- boolean variables: empty is off; buffsize grains; ring_slots' lower bound ----

def test_an_empty_boolean_variable_is_off():
    """VAR= (set but empty, as shell scripts clear a flag) is off, as the format says, not a parse error."""
    assert Settings.from_env({"SLICETRACE_ASSERT_WARM": ""}).assert_warm is False
    assert Settings.from_env({"SLICETRACE_ASSERT_WARM": "  "}).assert_warm is False
    assert Settings.from_env({"SLICETRACE_ASSERT_WARM": "On"}).assert_warm is True


def test_buffsize_must_be_whole_grains_in_each_of_the_8_steps():
    """A multiple of 512 that is not one of 8 * 512 would give the FIFO steps a part grain."""
    assert Settings(buffsize=(1 << 20) + 4096).buffsize == (1 << 20) + 4096
    with pytest.raises(ConfigError, match=r"^buffsize=1049088 must be >= 32768 and a multiple of 4096 "):
        Settings(buffsize=(1 << 20) + 512)
    with pytest.raises(ConfigError, match=r"^buffsize=36352 must be >= 32768 and a multiple of 4096 "):
        Settings(buffsize=32768 + 7 * 512)


def test_ring_slots_have_a_lower_bound_of_64():
    assert Settings(ring_slots=64).ring_slots == 64
    with pytest.raises(ConfigError, match=r"^ring_slots=32 must be a power of two in 64\.\.16777216"):
        Settings(ring_slots=32)


def test_a_closing_communicators_last_info_lines_show_beside_a_warn_one(capsys, monkeypatch):
    """The level follows the most verbose open communicator; a closing one counts until its plugins have said
    their last (linkstats' summary at close is INFO), not only until close begins."""
    import logging
    import weakref
    import numpy as np
    import slicetrace
    from slicetrace import session
    log = logging.getLogger("slicetrace")
    monkeypatch.setattr(log, "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(session, "_LOG_LIVE", weakref.WeakKeyDictionary())
    level = log.level
    try:
        quiet = slicetrace.init(backend="null", debug="WARN")
        from slicetrace.rendezvous import DictStore        # 2 ranks: the null backend's stamps have a peer
        loud = slicetrace.init(backend="null", debug="INFO", profiler_plugin="linkstats", rank=0, world_size=2,
                               store=DictStore({}), job="loud")
        loud.all_reduce(np.ones(1 << 16, np.float32))
        loud.close()
        assert log.level == logging.WARNING                 # the INFO one is closed
        quiet.close()
    finally:
        log.setLevel(level)
    assert "slicetrace rank 0 INFO: slicetrace linkstats rank 0: " in capsys.readouterr().err


def test_pool_size_variables_are_not_read_when_pool_sizes_is_given():
    """pool_sizes= replaces every pool variable (README), as any keyword its variable: a bad
    SLICETRACE_PROFILE_COLL_POOL_SIZE still failed init(pool_sizes={...})."""
    env = {"SLICETRACE_PROFILE_COLL_POOL_SIZE": "x", "SLICETRACE_PROFILE_P2P_POOL_SIZE": "9"}
    s = Settings.from_env(env, pool_sizes={"COLL": 5})
    assert dict(s.pool_sizes) == {"COLL": 5}                # the variables, bad or good, are not read
    with pytest.raises(ConfigError, match="SLICETRACE_PROFILE_COLL_POOL_SIZE='x' must be an integer >= 1"):
        Settings.from_env(env)


def test_init_with_rank_from_the_environment_names_the_missing_world_size_variable(monkeypatch):
    """RANK=1 alone said "RANK=1 and world_size=None": no world_size keyword was given; WORLD_SIZE is missing."""
    import slicetrace
    from slicetrace.errors import UsageError
    for var in ("WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(UsageError, match=r"^RANK=1 and WORLD_SIZE=None: give both"):
        slicetrace.init(backend="null")
    with pytest.raises(UsageError, match=r"^rank=1 and world_size=None: give both"):
        slicetrace.init(rank=1, backend="null")


def test_init_with_half_of_the_torchrun_pair_in_the_environment_is_refused_as_torch_refuses_it(monkeypatch):
    """RANK=0 alone made a world of one while RANK=1 alone was an error; torch.distributed's env:// needs both
    (torchrun sets both), so either alone is an error naming the missing one; keywords still complete a pair."""
    import slicetrace
    from slicetrace.errors import UsageError
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(UsageError, match=r"^RANK=0 and WORLD_SIZE=None: give both"):
        slicetrace.init(backend="null")
    comm = slicetrace.init(world_size=1, backend="null")       # the keyword completes the pair
    assert (comm.rank, comm.world_size) == (0, 1)
    comm.close()
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(UsageError, match=r"^RANK=None and WORLD_SIZE=1: give both"):
        slicetrace.init(backend="null")
    monkeypatch.delenv("WORLD_SIZE")
    comm = slicetrace.init(backend="null")                      # neither: one rank
    assert (comm.rank, comm.world_size) == (0, 1)
    comm.close()


def test_with_an_unknown_setting_is_a_config_error_naming_it():
    # Settings is public: with_(nchanels=2) raised dataclasses' bare TypeError
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['nchanels'\] \(did you mean nchannels for nchanels\?\)"):
        Settings().with_(nchanels=2)
    assert Settings().with_(nchannels=2).nchannels == 2


def test_an_empty_cache_dir_keyword_is_the_default_as_the_variables_is():
    # the README's row (variable and keyword): "empty: the default"; the keyword kept '', the working directory
    assert Settings(cache_dir="").cache_dir == config.DEFAULT_CACHE_DIR
    assert Settings.from_env({}, cache_dir=" ").cache_dir == config.DEFAULT_CACHE_DIR
    assert Settings.from_env({"SLICETRACE_CACHE_DIR": ""}).cache_dir == config.DEFAULT_CACHE_DIR


@pytest.mark.parametrize("name, what", [("profile_dump_file", "a path prefix"), ("cache_dir", "a folder path")])
def test_a_nul_byte_in_a_path_setting_is_a_config_error_naming_it(name, what):
    """open() raised ValueError in the example plugin's init: logged, the plugin dropped, the run went on untraced."""
    with pytest.raises(ConfigError, match=rf"^{name}='m\\x00n' must be {what} without a NUL byte$"):
        Settings(**{name: "m\0n"})


@pytest.mark.parametrize("blank", ["", " "])
def test_an_empty_variable_counts_as_unset_for_every_variable(blank):
    """`X=` was unset for PROFILER_PLUGIN, PROFILE_DUMP_FILE, CACHE_DIR, ... but an error for TIMEOUT, BACKEND,
    PROFILE_EVENT_MASK, DEBUG, BUFFSIZE and the pool sizes; one rule now, as NCCL's getenv checks."""
    env = {v.name: blank for v in VARIABLES}
    env.update({var: blank for var in POOL_VARIABLES})
    assert Settings.from_env(env) == Settings()
    assert config.env_source("timeout_s", env) is None          # an error names no empty variable as its source


@pytest.mark.parametrize("name, level", [("WARNING", logging.WARNING), ("warn", logging.WARNING),
                                         ("error", logging.ERROR), ("CRITICAL", logging.CRITICAL),
                                         ("Debug", logging.DEBUG)])
def test_debug_takes_pythons_level_names(name, level):
    """SLICETRACE_DEBUG=WARNING, Python's own name for the default, was refused."""
    s = Settings.from_env({"SLICETRACE_DEBUG": name})
    assert getattr(logging, s.debug.upper()) == level
    with pytest.raises(ConfigError, match=r"SLICETRACE_DEBUG='LOUD': debug='LOUD' is not one of \('WARN', "):
        Settings.from_env({"SLICETRACE_DEBUG": "LOUD"})
