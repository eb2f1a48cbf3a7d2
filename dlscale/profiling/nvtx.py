"""NVTX ranges: name a region once, see it in Nsight Systems and in torch's profiler trace.

:func:`nvtx_range` marks a region for Nsight Systems (through the ``nvtx`` package, a no-op
unless a profiler is attached, and safe on CPU-only machines — unlike ``torch.cuda.nvtx``,
which raises on CPU builds of torch; where the package is missing but CUDA is there, as in a
site's PyTorch module, and on ROCm, where it emits the roctx ranges rocprof reads, through
``torch.cuda.nvtx``) and, while torch's profiler records, as a
``torch.profiler.record_function``, so the same names appear in a CPU trace (with no profiler recording it is left
out: it cost 6 µs a range, every step). The training
step marks ``data``, ``forward``, ``backward`` and ``optimizer`` every step (lesson 04).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from dlscale.errors import DlscaleError, import_optional

#: The ranges the training loop marks every step.
RANGES = ("data", "forward", "backward", "optimizer")

_nvtx_module: Any = None


class _TorchCudaNvtx:
    """``torch.cuda.nvtx`` behind the ``nvtx`` package's two calls (for a torch with CUDA but no package)."""

    __name__ = "torch.cuda.nvtx"

    @staticmethod
    def push_range(name: str, color: str | None = None) -> None:
        torch.cuda.nvtx.range_push(name)

    @staticmethod
    def pop_range() -> None:
        torch.cuda.nvtx.range_pop()


def _nvtx():
    """Where NVTX ranges go, looked up once: ``torch.cuda.nvtx`` on ROCm (it emits roctx ranges, which
    rocprof reads; the ``nvtx`` package's would reach no profiler), else the ``nvtx`` package, else
    ``torch.cuda.nvtx`` on CUDA, else False."""
    global _nvtx_module
    if _nvtx_module is None:
        if torch.version.hip is not None and torch.cuda.is_available():
            _nvtx_module = _TorchCudaNvtx()
            return _nvtx_module
        try:
            _nvtx_module = import_optional("nvtx", "profiling", "NVTX ranges for Nsight Systems")
        except DlscaleError:  # not an error: torch.cuda.nvtx on a GPU, no ranges on a CPU
            _nvtx_module = _TorchCudaNvtx() if torch.cuda.is_available() else False
    return _nvtx_module


def _profiler_enabled() -> bool:
    """Whether torch's profiler is recording now (its own check, as ``record_function`` would make it)."""
    return torch.autograd.profiler._is_profiler_enabled or torch._C._autograd._profiler_enabled()


def nvtx_backend() -> str:
    """What marks the NVTX ranges here: ``nvtx``, ``torch.cuda.nvtx`` or ``none`` (recorded in summary.json)."""
    module = _nvtx()
    return module.__name__ if module else "none"


def under_nsys(environ: dict[str, str] | None = None) -> bool:
    """Whether Nsight Systems is profiling this process (launch.sh's profile job says so; nsys's own variable too)."""
    environ = os.environ if environ is None else environ
    return bool(environ.get("DLSCALE_UNDER_NSYS") or environ.get("NSYS_PROFILING_SESSION_ID"))


class nvtx_range(contextlib.ContextDecorator):
    """Mark a region by name, as a context manager or a decorator.

    >>> with nvtx_range("forward"):
    ...     out = model(x)
    >>> @nvtx_range("load")
    ... def load(): ...
    """

    def __init__(self, name: str, color: str | None = None):
        self.name = name
        self.color = color
        self._records: list[Any] = []

    def __enter__(self) -> "nvtx_range":
        nvtx = _nvtx()
        if nvtx:
            nvtx.push_range(self.name, color=self.color)
        # (a record_function costs about 6 µs even with no profiler to see it: 4 ranges a step, every step)
        record = torch.profiler.record_function(self.name) if _profiler_enabled() else None
        if record is not None:
            record.__enter__()
        self._records.append(record)  # a stack, so the same object can be re-entered (recursion, decorators)
        return self

    def __exit__(self, *exc: object) -> None:
        record = self._records.pop()
        if record is not None:
            record.__exit__(*exc)
        nvtx = _nvtx()
        if nvtx:
            nvtx.pop_range()
