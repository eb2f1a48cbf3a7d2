"""What one K-Means fit found, whichever engine ran it: the estimator's fitted attributes, and timings."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class KMeansFit:
    """The centres, this rank's labels, the inertia over all ranks, the iterations and the seconds spent."""

    cluster_centers: np.ndarray
    labels: np.ndarray
    inertia: float
    n_iter: int
    timings: dict[str, float]
    #: The engine's pass: ``"compiled"`` or ``"gemm"`` (the torch engine, :class:`~dlscale.kmeans.lloyd.LloydFit`),
    #: or ``"daal4py"``.
    pass_name: str = "daal4py"


def timings(init: float, iterations: float, n_iter: int, total: float | None = None) -> dict[str, float]:
    """``timings_``: seconds of the initialisation, of the iterations and per iteration, and in all."""
    return {
        "init": init,
        "iterations": iterations,
        "per_iteration": iterations / max(n_iter, 1),
        "total": init + iterations if total is None else total,
    }
