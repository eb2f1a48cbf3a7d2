"""Which engine fits: ``torch`` (:mod:`~dlscale.kmeans.lloyd`) or ``daal4py`` (:mod:`~dlscale.kmeans.daal`)."""

from __future__ import annotations

import torch

from dlscale.distributed import group_size
from dlscale.kmeans import daal
from dlscale.kmeans.errors import KMeansError

BACKENDS = ("auto", "torch", "daal4py")


def resolve_backend(backend: str, device: torch.device) -> str:
    """``torch`` or ``daal4py`` for ``auto``.

    ``auto`` uses daal4py when the ranks were started by ``mpirun``/``srun`` without a torch
    process group (oneDAL's SPMD mode joins them), and torch everywhere else: on GPUs, in a
    process group, and in one process on CPUs, where it measured faster than daal4py
    (docs/benchmarks.md).
    """
    if backend not in BACKENDS:
        raise KMeansError(f"backend must be auto, torch or daal4py; got {backend!r}")
    if backend != "auto":
        return backend
    if device.type != "cpu" or group_size() > 1:
        return "torch"
    return "daal4py" if daal.spmd_ranks() > 1 and daal.available() else "torch"
