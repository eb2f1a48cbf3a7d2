"""Nsight Systems from the kit: the recommended ``nsys profile`` line and its NVTX summary read back.

:func:`nsys_command` builds the ``nsys profile`` line (capture range, traces, one report per
rank); :func:`parse_nvtx_sum` reads ``nsys stats --report nvtx_sum --format csv`` into rows
(lessons 04 and 09, ``slurm/perlmutter/profile.sbatch``).
"""

from __future__ import annotations

import csv
import io
import shlex
from collections.abc import Sequence
from typing import Any


def nsys_command(
    train_args: Sequence[str] = ("demo",),
    output: str = "runs/nsys/dlscale_%q{SLURM_PROCID}",
    cuda_graphs: bool = False,
    python: str = "python",
) -> list[str]:
    """``nsys profile ... python -m dlscale.train ARGS``: what to run on a GPU node, one report per rank.

    Pair it with ``profile_steps=start,stop`` in ``train_args``: the capture starts and stops
    at those steps through the CUDA profiler API, so the report holds only the steps you care
    about. Under Slurm, ``%q{SLURM_PROCID}`` gives each rank its own report.
    """
    command = [
        "nsys",
        "profile",
        "--trace=cuda,nvtx,osrt,cudnn,cublas",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop",
        "--force-overwrite=true",
        f"--output={output}",
    ]
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
    "Time (%)": "time_percent",
    "Time(%)": "time_percent",
    "Total Time (ns)": "total_ns",
    "Instances": "instances",
    "Avg (ns)": "avg_ns",
    "Average": "avg_ns",
    "Average (ns)": "avg_ns",
    "Med (ns)": "med_ns",
    "Median (ns)": "med_ns",
    "Min (ns)": "min_ns",
    "Minimum": "min_ns",
    "Minimum (ns)": "min_ns",
    "Max (ns)": "max_ns",
    "Maximum": "max_ns",
    "Maximum (ns)": "max_ns",
    "StdDev (ns)": "stddev_ns",
    "StdDev": "stddev_ns",
    "Style": "style",
    "Range": "range",
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
    start = next(
        (i for i, line in enumerate(lines) if "Total Time" in line and ("Range" in line or "Name" in line)), None
    )
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
                row[key] = (
                    float(value.replace(",", ""))
                    if "." in value or key == "time_percent"
                    else int(value.replace(",", ""))
                )
        rows.append(row)
    return rows


# -- FLOPs and MFU --------------------------------------------------------------------------------

#: Dense peak FLOP/s per GPU (or GCD) for the precisions training uses, from the vendors' data sheets
#: (SXM parts; "tf32" is the tensor-core rate that float32 convolutions get through cuDNN's TF32).
