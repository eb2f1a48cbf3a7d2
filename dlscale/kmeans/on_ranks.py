"""Start ``dlscale kmeans`` as N ranks (torchrun or mpirun) from Python, and read its summary.

Lesson 08 and ``dlscale bench kmeans`` launch the same command a Slurm job runs; this module
builds the launcher's command line, gives every rank the same threads, and turns a failed
job into one error that carries the job's own message.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

import numpy as np

from dlscale.jobs.local_ranks import run_local
from dlscale.runtime.threads import fair_threads


def kmeans_command(launcher: Literal["torchrun", "mpirun", "none"], procs: int, args: list[str]) -> list[str]:
    """The command line that starts ``python -m dlscale kmeans ARGS`` as ``procs`` ranks."""
    module = ["dlscale", "kmeans", *args]
    if launcher == "none" or procs == 1:
        return [sys.executable, "-m", *module]
    if launcher == "torchrun":
        from dlscale.jobs.local_ranks import torchrun_command

        return torchrun_command(procs, module)
    if launcher == "mpirun":  # Intel MPI from PyPI installs mpirun beside the interpreter
        return [str(Path(sys.executable).with_name("mpirun")), "-n", str(procs), sys.executable, "-m", *module]
    raise ValueError(f"launcher {launcher!r}: use torchrun, mpirun or none")


def launch_kmeans(
    input: str | Path | np.ndarray | list,
    k: int,
    out: str | Path,
    procs: int = 2,
    launcher: str = "torchrun",
    backend: str = "torch",
    init: str | Path | np.ndarray = "k-means++",
    max_iter: int = 300,
    tol: float = 1e-4,
    threads: int | None = None,
    warm_up: bool = False,
) -> dict | list[dict]:
    """Run ``dlscale kmeans`` on ``procs`` ranks and return its ``summary.json``.

    ``input`` (and an ``init`` of starting centres) may be arrays: they are saved into ``out`` as
    ``.npy`` files, which the ranks read. Each rank gets ``threads`` CPU threads (default: the
    machine's CPUs shared by the ranks), which the summary reports as ``threads``. A list of inputs is fitted in turn
    by the same ranks, in one launch, and gives a list of summaries; with ``warm_up`` each rank first fits its first
    rows once, untimed (``dlscale kmeans --warm-up``).
    """
    Path(out).mkdir(parents=True, exist_ok=True)
    inputs = list(input) if isinstance(input, list) else [input]
    for number, data in enumerate(inputs):
        if isinstance(data, np.ndarray):
            inputs[number] = Path(out) / ("input.npy" if len(inputs) == 1 else f"input-{number}.npy")
            np.save(inputs[number], data)
    if isinstance(init, np.ndarray):
        np.save(Path(out) / "init.npy", init)
        init = Path(out) / "init.npy"
    args = [
        *(item for data in inputs for item in ("--input", str(data))),
        "--k",
        str(k),
        "--init",
        str(init),
        "--max-iter",
        str(max_iter),
        "--tol",
        str(tol),
        "--backend",
        backend,
        "--device",
        "cpu",
        "--out",
        str(out),
        *(["--warm-up"] if warm_up else []),
    ]
    argv = kmeans_command(launcher, procs, args)
    run_local(argv, f"{' '.join(argv[:6])} ...", threads or fair_threads(procs))
    folders = [Path(out)] if len(inputs) == 1 else [Path(out) / str(number) for number in range(len(inputs))]
    summaries = [json.loads((folder / "summary.json").read_text()) for folder in folders]
    return summaries if isinstance(input, list) else summaries[0]
