"""Seeing where the time goes (lesson 04).

- :mod:`~dlscale.profiling.nvtx`: ``nvtx_range``, the named regions Nsight Systems and torch's
  profiler both show;
- :mod:`~dlscale.profiling.step_profiler`: ``StepProfiler``, a window of steps traced, and the
  nsys capture range;
- :mod:`~dlscale.profiling.nsys`: the ``nsys profile`` line and its NVTX summary parsed;
- :mod:`~dlscale.profiling.flops`: FLOPs per sample, the device's peak, MFU.
"""

from dlscale.profiling.flops import (
    PEAK_FLOPS,
    FlopCount,
    count_flops,
    flops_per_sample,
    mfu,
    peak_flops,
    peak_precision,
)
from dlscale.profiling.nsys import as_shell, nsys_command, nsys_stats_command, parse_nvtx_sum
from dlscale.profiling.nvtx import RANGES, nvtx_backend, nvtx_range, under_nsys
from dlscale.profiling.step_profiler import StepProfiler, phase_times, read_summary, summarize

__all__ = [
    "PEAK_FLOPS",
    "RANGES",
    "FlopCount",
    "StepProfiler",
    "as_shell",
    "count_flops",
    "flops_per_sample",
    "mfu",
    "nsys_command",
    "nsys_stats_command",
    "nvtx_backend",
    "nvtx_range",
    "parse_nvtx_sum",
    "peak_flops",
    "peak_precision",
    "phase_times",
    "read_summary",
    "summarize",
    "under_nsys",
]
