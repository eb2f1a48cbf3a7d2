"""Seeing where the time goes: NVTX ranges, a step-window profiler, Nsight Systems helpers, MFU.

- :func:`nvtx_range` marks a region for Nsight Systems (through the ``nvtx`` package, a no-op
  unless a profiler is attached, and safe on CPU-only machines — unlike ``torch.cuda.nvtx``,
  which raises on CPU builds of torch; where the package is missing but CUDA is there, as in
  a site's PyTorch module, through ``torch.cuda.nvtx``) and always as a
  ``torch.profiler.record_function``, so the same names appear in a CPU trace.
  ``dlscale.train`` marks ``data``, ``forward``, ``backward`` and ``optimizer`` every step.
- :class:`StepProfiler` profiles a window of steps (``profile_steps=start,stop``): a Chrome
  trace (open it at https://ui.perfetto.dev, no install needed) and a summary table in the run
  directory, and on CUDA the ``cudaProfilerApi`` window that ``nsys --capture-range`` waits for,
  opened and closed on every rank (a rank that never opens it gets an empty report).
- :func:`nsys_command` builds the recommended ``nsys profile`` line; :func:`parse_nvtx_sum`
  reads ``nsys stats --report nvtx_sum --format csv`` output into rows.
- :func:`flops_per_sample` counts a model's training FLOPs; :func:`mfu` turns throughput into
  model FLOPs utilisation.

Lesson 04 uses all of it.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shlex
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import DlscaleError, import_optional
from .throughput import ThroughputMeter

__all__ = ["RANGES", "StepProfiler", "ThroughputMeter", "flops_per_sample", "mfu", "nsys_command",
           "nsys_stats_command", "nvtx_range", "parse_nvtx_sum", "peak_flops"]

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
    """Where NVTX ranges go: the ``nvtx`` package, else ``torch.cuda.nvtx`` on CUDA, else False (looked up once)."""
    global _nvtx_module
    if _nvtx_module is None:
        try:
            _nvtx_module = import_optional("nvtx", "profiling", "NVTX ranges for Nsight Systems")
        except DlscaleError:  # not an error: torch.cuda.nvtx on a GPU, no ranges on a CPU
            _nvtx_module = _TorchCudaNvtx() if torch.cuda.is_available() else False
    return _nvtx_module


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
        record = torch.profiler.record_function(self.name)
        record.__enter__()
        self._records.append(record)  # a stack, so the same object can be re-entered (recursion, decorators)
        return self

    def __exit__(self, *exc: object) -> None:
        self._records.pop().__exit__(*exc)
        nvtx = _nvtx()
        if nvtx:
            nvtx.pop_range()


class StepProfiler:
    """Profile optimizer steps ``[start, stop)``; call :meth:`step` after every optimizer step.

    Steps are counted from the start of training, also after a resume: ``first_step`` is the
    step the run resumed from (the profiled window is what is left of ``[start, stop)``).
    With ``trace`` (the main rank) it writes ``trace.json`` (Chrome trace format) and
    ``profile_summary.json`` into ``run_dir`` when the window closes. On CUDA every rank calls
    ``torch.cuda.profiler.start()/stop()`` around the window, so ``nsys profile
    --capture-range=cudaProfilerApi`` records just those steps in each rank's report. Under
    nsys the trace keeps CPU activity only: CUDA activity would make torch subscribe to CUPTI,
    which nsys needs for itself.
    """

    def __init__(self, run_dir: str | Path, start: int, stop: int, device: torch.device, trace: bool = True,
                 first_step: int = 0, environ: dict[str, str] | None = None):
        self.run_dir, self.first_step = Path(run_dir), first_step
        self.start, self.stop = max(start, first_step), stop
        self.active = self.start < self.stop  # (nothing to do once the window is past)
        self.capture = self.active and device.type == "cuda"
        self.summary: dict[str, Any] | None = None
        self._profiler = None
        if not (self.active and trace):
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.capture and not under_nsys(environ):
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.activities = activities
        skip = self.start - first_step  # the profiler counts its own step() calls, from this run's first
        warmup = 1 if skip > 0 else 0  # the profiler warms up on the step before the window where there is one
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
            schedule = torch.profiler.schedule(skip_first=skip - warmup, wait=0, warmup=warmup,
                                               active=self.stop - self.start, repeat=1)
        self._profiler = torch.profiler.profile(activities=activities, on_trace_ready=self._write, schedule=schedule)

    def __enter__(self) -> "StepProfiler":
        if self._profiler is not None:
            self._profiler.__enter__()
        if self.capture and self.start == self.first_step:
            torch.cuda.profiler.start()
        return self

    def step(self, step: int) -> None:
        """Call with the number of optimizer steps done so far (counted from the start of training)."""
        if self.capture and step == self.start and step > self.first_step:
            torch.cuda.profiler.start()
        if self.capture and step == self.stop:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        if self._profiler is not None:
            self._profiler.step()

    def __exit__(self, *exc: object) -> None:
        if self._profiler is not None:
            self._profiler.__exit__(*exc)
            self._profiler = None

    def _write(self, profiler: torch.profiler.profile) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(self.run_dir / "trace.json"))
        self.summary = summarize(profiler, self.stop - self.start)
        (self.run_dir / "profile_summary.json").write_text(json.dumps(self.summary, indent=1) + "\n")


def summarize(profiler: torch.profiler.profile, steps: int, top: int = 12) -> dict[str, Any]:
    """Milliseconds per step for each training-loop range and for the top operators by self time."""
    events = profiler.key_averages()
    device_attr = "device_time_total" if hasattr(events[0], "device_time_total") else "cuda_time_total"

    def row(event) -> dict[str, Any]:
        return {"name": event.key, "calls": event.count,
                "cpu_ms_per_step": event.cpu_time_total / 1000 / steps,
                "self_cpu_ms_per_step": event.self_cpu_time_total / 1000 / steps,
                "device_ms_per_step": getattr(event, device_attr, 0) / 1000 / steps}

    ranges = [row(e) for e in events if e.key in RANGES]
    ranges.sort(key=lambda r: RANGES.index(r["name"]))
    operators = [row(e) for e in events if e.key not in RANGES and not e.key.startswith("ProfilerStep")]
    operators.sort(key=lambda r: -r["self_cpu_ms_per_step"])
    return {"steps": steps, "ranges": ranges, "top_operators": operators[:top]}


def phase_times(summary: dict[str, Any], device: torch.device | str) -> tuple[dict[str, float], str]:
    """Milliseconds per step of each loop phase, on the device that does the work, and which clock it is.

    On a GPU the CPU time of a range is mostly kernel launches (the kernels run later, on the
    device), so the device's own time is what a phase costs; on a CPU they are the same.
    """
    key = "device_ms_per_step" if torch.device(device).type == "cuda" else "cpu_ms_per_step"
    return {row["name"]: row[key] for row in summary["ranges"]}, key.removesuffix("_ms_per_step")


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    """The ``profile_summary.json`` a run with ``profile_steps`` wrote."""
    return json.loads((Path(run_dir) / "profile_summary.json").read_text())


# -- Nsight Systems -----------------------------------------------------------------------------

def nsys_command(train_args: Sequence[str] = ("demo",), output: str = "runs/nsys/dlscale_%q{SLURM_PROCID}",
                 cuda_graphs: bool = False, python: str = "python") -> list[str]:
    """``nsys profile ... python -m dlscale.train ARGS``: what to run on a GPU node, one report per rank.

    Pair it with ``profile_steps=start,stop`` in ``train_args``: the capture starts and stops
    at those steps through the CUDA profiler API, so the report holds only the steps you care
    about. Under Slurm, ``%q{SLURM_PROCID}`` gives each rank its own report.
    """
    command = ["nsys", "profile", "--trace=cuda,nvtx,osrt,cudnn,cublas", "--capture-range=cudaProfilerApi",
               "--capture-range-end=stop", "--force-overwrite=true", f"--output={output}"]
    if cuda_graphs:
        command.append("--cuda-graph-trace=node")
    return command + [python, "-m", "dlscale.train", *train_args]


def nsys_stats_command(report: str, old_names: bool = False) -> list[str]:
    """``nsys stats`` for the NVTX range summary as CSV (nsys before 2021.5 calls the report ``nvtxsum``)."""
    return ["nsys", "stats", "--report", "nvtxsum" if old_names else "nvtx_sum", "--format", "csv", report]


def as_shell(command: Sequence[str]) -> str:
    """A command list as one line to paste into a terminal or a batch script."""
    return shlex.join(command)


_COLUMNS = {  # nsys's column names, old and new, to ours
    "Time (%)": "time_percent", "Time(%)": "time_percent", "Total Time (ns)": "total_ns", "Instances": "instances",
    "Avg (ns)": "avg_ns", "Average": "avg_ns", "Average (ns)": "avg_ns", "Med (ns)": "med_ns", "Median (ns)": "med_ns",
    "Min (ns)": "min_ns", "Minimum": "min_ns", "Minimum (ns)": "min_ns", "Max (ns)": "max_ns", "Maximum": "max_ns",
    "Maximum (ns)": "max_ns", "StdDev (ns)": "stddev_ns", "StdDev": "stddev_ns", "Style": "style", "Range": "range",
    "Name": "range",
}


def parse_nvtx_sum(text: str) -> list[dict[str, Any]]:
    """Rows of ``nsys stats --report nvtx_sum`` (or the older ``nvtxsum``) CSV output.

    ``nsys stats`` prints a line or two about what it processes before the CSV; those are
    skipped. Each row has ``range``, ``time_percent``, ``total_ns``, ``instances`` and the
    per-instance statistics that version printed, with numbers as numbers and the leading
    ``:`` that newer versions put before push/pop range names removed.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "Total Time" in line and ("Range" in line or "Name" in line)),
                 None)
    if start is None:
        raise ValueError("no NVTX summary table found: expected nsys stats --report nvtx_sum --format csv output")
    rows = []
    for raw in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not raw or not any(raw.values()):
            continue
        row: dict[str, Any] = {}
        for column, value in raw.items():
            key = _COLUMNS.get((column or "").strip())
            if key is None or value is None:
                continue
            value = value.strip()
            if key in ("range", "style"):
                row[key] = value.lstrip(":") if key == "range" else value
            else:
                row[key] = float(value.replace(",", "")) if "." in value or key == "time_percent" else int(value.replace(",", ""))
        rows.append(row)
    return rows


# -- FLOPs and MFU --------------------------------------------------------------------------------

#: Dense peak FLOP/s per GPU (or GCD) for the precisions training uses, from the vendors' data sheets
#: (SXM parts; "tf32" is the tensor-core rate that float32 convolutions get through cuDNN's TF32).
PEAK_FLOPS = {
    ("A100", "bf16"): 312e12, ("A100", "fp16"): 312e12, ("A100", "tf32"): 156e12, ("A100", "fp32"): 19.5e12,
    ("H100", "bf16"): 989e12, ("H100", "fp16"): 989e12, ("H100", "tf32"): 494.7e12, ("H100", "fp32"): 67e12,
    ("H200", "bf16"): 989e12, ("H200", "fp16"): 989e12, ("H200", "tf32"): 494.7e12, ("H200", "fp32"): 67e12,
    ("V100", "fp16"): 125e12, ("V100", "fp32"): 15.7e12,
    ("MI250X", "bf16"): 191.5e12, ("MI250X", "fp16"): 191.5e12, ("MI250X", "fp32"): 47.9e12,
}


def peak_flops(device: torch.device | str, precision: str) -> float | None:
    """The peak FLOP/s of a known GPU for ``precision``, or None (CPUs, unknown GPUs)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for (gpu, prec), flops in PEAK_FLOPS.items() if gpu in name and prec == precision), None)


def peak_precision(device: torch.device | str, precision: str, convolutions: bool = True) -> str:
    """The precision whose peak an ``fp32`` run really runs at: ``tf32`` where cuDNN (for a model
    of convolutions, PyTorch's default) or cuBLAS (``allow_tf32`` for matmuls) uses TF32 and the GPU
    has it; otherwise ``precision`` itself.
    """
    device = torch.device(device)
    if precision != "fp32" or device.type != "cuda":
        return precision
    tf32 = torch.backends.cudnn.allow_tf32 if convolutions else torch.backends.cuda.matmul.allow_tf32
    name = torch.cuda.get_device_name(device)
    has_tf32 = any(gpu in name for gpu, prec in PEAK_FLOPS if prec == "tf32")
    return "tf32" if tf32 and has_tf32 else "fp32"


def flops_per_sample(model: nn.Module, input_shape: Sequence[int], loss_fn: Callable | None = None,
                     targets: int | None = None, batch: int = 2) -> float:
    """FLOPs of one training step (forward and backward) per sample, counted by ``FlopCounterMode``.

    ``targets`` is the number of regression targets; by default, as many as the model outputs."""
    from torch.utils.flop_counter import FlopCounterMode

    first = next(model.parameters())
    # The count does not depend on values; no RNG draws.
    x = torch.zeros(batch, *input_shape, device=first.device, dtype=first.dtype)
    loss_fn = loss_fn or nn.functional.mse_loss
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with FlopCounterMode(display=False) as counter:
        out = model(x)
        y = torch.zeros(batch, out.shape[1] if targets is None else targets, device=first.device, dtype=first.dtype)
        loss_fn(out, y).backward()
    model.zero_grad(set_to_none=True)
    model.load_state_dict(state)  # batch-norm statistics moved during the count
    return counter.get_total_flops() / batch


def mfu(samples_per_s: float, flops_per_sample_: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: achieved training FLOP/s over the device's peak (None if unknown)."""
    if not peak:
        return None
    return samples_per_s * flops_per_sample_ / peak
