"""Distributed K-Means: a scikit-learn estimator with a torch engine and a daal4py engine.

- :mod:`~dlscale.kmeans.estimator`: :class:`KMeans`, a scikit-learn estimator (needs the ``kmeans`` extra);
- :mod:`~dlscale.kmeans.lloyd`: the torch engine (Lloyd's algorithm, in one process or over a job's ranks);
- :mod:`~dlscale.kmeans.scoring`: scoring rows against centres (a GEMM per chunk, or on CPUs the compiled loops of
  :mod:`~dlscale.kmeans.compiled_scoring`);
- :mod:`~dlscale.kmeans.cpu_pass`: Lloyd's pass on CPUs, chosen per fit (counted work, a probed ratio) between
  :mod:`~dlscale.kmeans.hamerly` (the compiled pass that skips rows by Hamerly's bounds) and
  :mod:`~dlscale.kmeans.blas_pass` (every row scored by a GEMM; the same labels and sums, bit for bit);
- :mod:`~dlscale.kmeans.initialization`: k-means++, k-means|| and random initial centres, over ranks;
- :mod:`~dlscale.kmeans.daal`: Intel oneDAL's SPMD K-Means (daal4py) under ``mpirun`` or ``srun``;
- :mod:`~dlscale.kmeans.backend`: which of the two engines ``backend="auto"`` picks;
- :mod:`~dlscale.kmeans.result`: what a fit found, whichever engine ran it;
- :mod:`~dlscale.kmeans.command`: ``dlscale kmeans``: inputs per rank, images, outputs;
- :mod:`~dlscale.kmeans.on_ranks`: ``dlscale kmeans`` started as N ranks from Python (lesson 08);
- :mod:`~dlscale.bench.kmeans`: ``dlscale bench kmeans``: the engines side by side, and their scaling.

Lesson 08 teaches it. ``import dlscale.kmeans`` works without scikit-learn; asking for
``KMeans`` then raises one :class:`KMeansError` naming the extra.
"""

from typing import Any

from dlscale.kmeans.backend import resolve_backend
from dlscale.kmeans.errors import KMeansError

__all__ = ["KMeans", "KMeansError", "resolve_backend"]


def __getattr__(name: str) -> Any:
    if name == "KMeans":  # imported on first use: it is built on scikit-learn, an optional extra
        from dlscale.kmeans.estimator import KMeans

        return KMeans
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
