"""SLICETRACE_DEBUG=INFO's init line: what each rank set up and why, as NCCL_DEBUG=INFO's 'Init COMPLETE' says."""
from __future__ import annotations

import logging

import numpy as np

import slicetrace


def _init_lines(caplog, **kw) -> list[str]:
    caplog.set_level(logging.INFO, logger="slicetrace")
    with slicetrace.init(backend="cpu", debug="INFO", **kw) as comm:
        comm.all_reduce(np.ones(4, np.float32))
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("init rank")]


def test_info_names_the_backends_choices_and_that_profiling_is_off(caplog):
    (line,) = _init_lines(caplog, nchannels=2, cpu_wait="spin", cpu_bind="on")
    assert line.startswith("init rank 0 of 1, job ")
    assert "backend cpu: 2 channels, FIFO 4194304 B in 8 steps, waits spin" in line
    assert "(cpu_wait=spin)" in line
    # one rank never binds: affinity binds only when every rank has a core and runs one channel
    assert "not bound (one core per rank and one channel only) (cpu_bind=on)" in line
    assert line.endswith("; profiling off (no profiler plugin)")


def test_info_names_the_plugins_their_mask_and_the_drain(caplog, tmp_path):
    (line,) = _init_lines(caplog, profiler_plugin="example", profile_dump_file=str(tmp_path / "t"),
                          profile_event_mask=0x10002, sample_rate=3, profile_min_bytes=64)
    assert "profiling: example (event mask 0x10002), with parents 0x10707, KernelStep sample rate 3" in line
    assert "min bytes 64, inline every 32 ops or 20 ms" in line


def test_info_says_why_profiling_is_off_when_every_plugin_failed_in_init(caplog):
    (line,) = _init_lines(caplog, profiler_plugin="tests.helpers.plugins:InitFails")
    assert line.endswith("; profiling off (1 plugin failed in init)")


def test_no_init_line_at_the_default_level(caplog):
    caplog.set_level(logging.WARNING, logger="slicetrace")
    with slicetrace.init(backend="cpu") as comm:
        comm.all_reduce(np.ones(4, np.float32))
    assert not [r for r in caplog.records if r.getMessage().startswith("init rank")]
