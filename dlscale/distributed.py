"""Data-parallel plumbing: how this process was launched, and (later) process groups and DDP.

For now it answers one question, which lesson 00 and ``dlscale info`` show: which
launcher started this process. Every launcher leaves its own environment variables; we
read them, never a hard-coded ``SLURM_PROCID``, so the same code runs under torchrun,
``srun``, ``mpirun`` or on its own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: Launchers in the order they are checked, with a variable each one always sets.
LAUNCHER_MARKERS = (
    ("torchrun", "TORCHELASTIC_RUN_ID"),
    ("torchrun", "LOCAL_RANK"),
    ("slurm", "SLURM_PROCID"),
    ("mpi", "OMPI_COMM_WORLD_RANK"),
    ("mpi", "PMI_RANK"),
    ("mpi", "PMIX_RANK"),
    ("ipyparallel", "IPP_ENGINE_ID"),
)


def detect_launcher(environ: Mapping[str, str] | None = None) -> str:
    """``torchrun``, ``slurm``, ``mpi``, ``ipyparallel``, or ``single`` for a plain process.

    A Slurm *allocation* (``SLURM_JOB_ID`` without ``SLURM_PROCID``, e.g. a Jupyter
    server on a compute node) is still a single process: only ``srun`` makes ranks.
    """
    environ = os.environ if environ is None else environ
    for launcher, variable in LAUNCHER_MARKERS:
        if variable in environ:
            return launcher
    return "single"
