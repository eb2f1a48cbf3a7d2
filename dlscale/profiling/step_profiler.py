"""A window of training steps, profiled: a Chrome trace, a summary table, and the Nsight capture range.

:class:`StepProfiler` profiles ``profile_steps=start,stop``: a Chrome trace (open it at
https://ui.perfetto.dev, no install needed) and a summary table in the run directory, and on
CUDA the ``cudaProfilerApi`` window that ``nsys --capture-range`` waits for, opened and closed
on every rank (a rank that never opens it gets an empty report). Lesson 04 reads its summary
(:func:`read_summary`, :func:`phase_times`).
"""

from __future__ import annotations

import json
import warnings
from bisect import bisect_right
from pathlib import Path
from typing import Any

import torch

from dlscale.profiling.nvtx import RANGES, under_nsys


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

    def __init__(
        self,
        run_dir: str | Path,
        start: int,
        stop: int,
        device: torch.device,
        trace: bool = True,
        first_step: int = 0,
        environ: dict[str, str] | None = None,
    ):
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
            schedule = torch.profiler.schedule(
                skip_first=skip - warmup, wait=0, warmup=warmup, active=self.stop - self.start, repeat=1
            )
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
        self.summary = summarize(
            profiler, self.stop - self.start, by_device=torch.profiler.ProfilerActivity.CUDA in self.activities
        )
        (self.run_dir / "profile_summary.json").write_text(json.dumps(self.summary, indent=1) + "\n")


def summarize(profiler: torch.profiler.profile, steps: int, top: int = 12, by_device: bool = False) -> dict[str, Any]:
    """Milliseconds per step for each training-loop range, for the top operators by self time (their
    kernels' time with ``by_device``, when the GPU's activity was profiled) and in the collectives.
    With ``by_device`` a range's device time is that of the kernels launched inside it on any thread
    (:func:`device_time_by_window`)."""
    windows = device_time_by_window(profiler.events()) if by_device else None
    return summarize_events(profiler.key_averages(), steps, top, by_device, windows)


def device_time_by_window(events: Any, names: tuple[str, ...] = RANGES) -> dict[str, float]:
    """Microseconds of device work launched inside each named range, whichever thread launched it.

    A ``record_function`` range collects only the kernels launched on its own thread, and autograd
    runs the backward pass on a thread of its own, so on a GPU the ``backward`` range's own device
    time is close to 0 (pytorch/pytorch#144778, pytorch/kineto#1132). Here each host event's own
    kernels (its self device time) go to the range whose host interval holds the event's start, on
    whatever thread the event ran: the main thread waits inside ``backward`` while autograd's launches.
    """
    host = [e for e in events if _on_host(e)]
    windows = sorted((e.time_range.start, e.time_range.end, e.name) for e in host if e.name in names)
    starts = [start for start, _, _ in windows]
    totals = dict.fromkeys(names, 0.0)
    for event in host:
        own = getattr(event, "self_device_time_total", None)
        own = getattr(event, "self_cuda_time_total", 0.0) if own is None else own  # (torch's older name)
        if event.name in names or not own:
            continue
        index = bisect_right(starts, event.time_range.start) - 1
        if index >= 0 and event.time_range.start < windows[index][1]:
            totals[windows[index][2]] += own
    return totals


def _on_host(event: Any) -> bool:
    return str(getattr(event, "device_type", "CPU")).endswith("CPU")


def summarize_events(
    events: Any, steps: int, top: int = 12, by_device: bool = False, windows: dict[str, float] | None = None
) -> dict[str, Any]:
    """:func:`summarize` of ``key_averages()``'s rows (and, from ``windows``, each range's device time in
    microseconds over the profiled steps, as :func:`device_time_by_window` counts it).

    On a GPU each range appears twice there: the host's ``record_function`` event and, with the
    same name, the ``gpu_user_annotation`` Kineto records on the device (``key_averages`` keeps
    them apart by device type). Only the host's rows count here: one row per range, whose calls
    are the steps profiled and whose device time is that of the kernels launched inside it (``windows``;
    without them, those its own thread launched).
    """
    events = list(events)
    new_names = events and hasattr(events[0], "device_time_total")  # (torch renamed cuda_* to device_*)
    device_attr, self_device_attr = (
        ("device_time_total", "self_device_time_total") if new_names else ("cuda_time_total", "self_cuda_time_total")
    )
    collectives = _collective_us(events, self_device_attr, by_device) / 1000 / steps
    events = [e for e in events if _on_host(e)]

    def row(event) -> dict[str, Any]:
        return {
            "name": event.key,
            "calls": event.count,
            "cpu_ms_per_step": event.cpu_time_total / 1000 / steps,
            "self_cpu_ms_per_step": event.self_cpu_time_total / 1000 / steps,
            "device_ms_per_step": getattr(event, device_attr, 0) / 1000 / steps,
            "self_device_ms_per_step": getattr(event, self_device_attr, 0) / 1000 / steps,
        }

    ranges = [row(e) for e in events if e.key in RANGES]
    ranges.sort(key=lambda r: RANGES.index(r["name"]))
    for r in ranges if windows is not None else []:
        r["device_ms_per_step"] = windows.get(r["name"], 0.0) / 1000 / steps
    operators = [row(e) for e in events if e.key not in RANGES and not e.key.startswith("ProfilerStep")]
    # on a GPU an operator costs the time of its own kernels; its CPU time there is mostly launching them
    operators.sort(key=lambda r: -r["self_device_ms_per_step" if by_device else "self_cpu_ms_per_step"])
    return {"steps": steps, "ranges": ranges, "top_operators": operators[:top], "collectives_ms_per_step": collectives}


def _collective_us(events: list, self_device_attr: str, by_device: bool) -> float:
    """Microseconds spent in the collectives: on a GPU their NCCL kernels' device time (``ncclDevKernel_*``),
    on a CPU the host time of gloo's own ranges (``gloo:all_gather``, ...), in which gloo blocks the caller."""
    if by_device:
        return sum(
            getattr(e, self_device_attr, 0) for e in events if not _on_host(e) and e.key.lower().startswith("nccl")
        )
    return sum(e.cpu_time_total for e in events if _on_host(e) and e.key.startswith(("gloo:", "nccl:")))


def phase_times(summary: dict[str, Any], device: torch.device | str) -> tuple[dict[str, float], str]:
    """Milliseconds per step of each loop phase, on the device that does the work, and which clock it is.

    On a GPU the CPU time of a range is mostly kernel launches (the kernels run later, on the
    device), so the device's own time is what a phase costs; on a CPU they are the same.
    """
    key = "device_ms_per_step" if torch.device(device).type == "cuda" else "cpu_ms_per_step"
    return {row["name"]: row[key] for row in summary["ranges"]}, key.removesuffix("_ms_per_step")


def operator_times(summary: dict[str, Any], device: torch.device | str) -> tuple[list[tuple[str, float]], str]:
    """The top operators and their own milliseconds per step on the device that does the work (self device
    time on a GPU, self CPU time on a CPU), largest first, and which clock it is."""
    key = "self_device_ms_per_step" if torch.device(device).type == "cuda" else "self_cpu_ms_per_step"
    rows = sorted(summary["top_operators"], key=lambda r: -r.get(key, 0.0))
    return [(r["name"], r.get(key, 0.0)) for r in rows], key.removesuffix("_ms_per_step").replace("_", " ")


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    """The ``profile_summary.json`` a run with ``profile_steps`` wrote."""
    return json.loads((Path(run_dir) / "profile_summary.json").read_text())


# -- Nsight Systems -----------------------------------------------------------------------------
