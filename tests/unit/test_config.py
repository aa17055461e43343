import pytest

from slicetrace.config import VARIABLES, Settings, describe, dist_env
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
    ({"ring_slots": 100}, r"^ring_slots=100 must be a power of two >= 64$"),
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
    with pytest.raises(ConfigError, match=r"^SLICETRACE_PROFILE_MIN_BYTES='1.5M' cannot be parsed: bytes, e\.g\."):
        parse("1.5M")
    with pytest.raises(ConfigError, match=r"^SLICETRACE_PROFILE_MIN_BYTES='-1K': profile_min_bytes=-1024 must be >= 0"):
        parse("-1K")
