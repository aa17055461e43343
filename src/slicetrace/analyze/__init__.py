"""Trace analysis: reads trace files only (no runtime imports, no GPU)."""
from .trace import (KERNEL_CH_TABLE, KERNEL_STEP_TABLE, check_trace, counters, kernel_chs, kernel_steps, load_trace,
                    load_traces)

__all__ = ["KERNEL_CH_TABLE", "KERNEL_STEP_TABLE", "check_trace", "counters", "kernel_chs", "kernel_steps",
           "load_trace", "load_traces"]
