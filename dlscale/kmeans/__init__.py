"""Distributed K-Means: a scikit-learn-style estimator with a torch engine and a daal4py engine.

- :mod:`~dlscale.kmeans.estimator`: :class:`KMeans` (Lloyd's algorithm, in one process or over a job's ranks);
- :mod:`~dlscale.kmeans.initialization`: k-means++, k-means|| and random initial centres, over ranks;
- :mod:`~dlscale.kmeans.daal`: Intel oneDAL's SPMD K-Means (daal4py) under ``mpirun`` or ``srun``;
- :mod:`~dlscale.kmeans.files`: ``dlscale kmeans``: inputs per rank, images, outputs;
- :mod:`~dlscale.kmeans.bench`: ``dlscale bench kmeans``: the engines side by side, and their scaling.

Lesson 08 teaches it.
"""

from .errors import KMeansError
from .estimator import KMeans, resolve_backend

__all__ = ["KMeans", "KMeansError", "resolve_backend"]
