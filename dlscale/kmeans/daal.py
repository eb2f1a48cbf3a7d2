"""The daal4py engine of :class:`dlscale.kmeans.KMeans`: Intel oneDAL's SPMD K-Means under MPI.

:func:`fit_daal4py` takes the data and the settings and returns a :class:`~dlscale.kmeans.result.KMeansFit`; the
estimator sets its own attributes from it (no module writes another's object).

daal4py ships inside ``scikit-learn-intelex`` (``pip install -e '.[kmeans]'``, which also
brings Intel MPI's ``mpirun`` from the ``impi-rt`` wheel). Launched by ``mpirun -n N`` or
``srun``, every rank passes its own shard and oneDAL runs the iterations with MPI
collectives (``distributed=True``); in a single process it runs on the local data.

``d4p.daalinit()`` starts MPI once per process and ``d4p.daalfini()`` is registered to run
at exit: MPI cannot be started again after it is finalised, so finalising after each fit
would leave a notebook kernel or a script unable to fit twice.

oneDAL stops on the relative change of the objective (``accuracyThreshold``, set to
``tol``), not on scikit-learn's centre shift, and in SPMD mode (scikit-learn-intelex
2026.2.0, measured here) it runs until the centres stop moving or ``max_iter`` whatever
the threshold; the torch backend follows scikit-learn exactly. From the same start with
``tol=0`` the two backends, and 1 or N daal4py ranks, agree to rounding.
"""

from __future__ import annotations

import atexit
import time
from types import ModuleType

import numpy as np

from dlscale import distributed
from dlscale.errors import import_optional, importable
from dlscale.kmeans.errors import KMeansError
from dlscale.kmeans.result import KMeansFit, timings

INIT_METHODS = {"k-means++": "plusPlusDense", "k-means||": "parallelPlusDense", "random": "randomDense"}
_mpi_started = False


def available() -> bool:
    """Whether daal4py can be imported."""
    return importable("daal4py")


def load() -> ModuleType:
    """daal4py (it ships in scikit-learn-intelex), or a :class:`KMeansError` naming the extra."""
    return import_optional("daal4py", "kmeans", "backend='daal4py'", KMeansError, "or use backend='torch'")


def spmd_ranks() -> int:
    """The number of MPI ranks this process belongs to (1 when not launched by mpirun or srun)."""
    environment = distributed.detect() if distributed.detect_launcher() in ("mpi", "slurm") else None
    return environment.world_size if environment else 1


def start_mpi(d4p: ModuleType) -> None:
    """``daalinit()`` once per process, with ``daalfini()`` at exit."""
    global _mpi_started
    if not _mpi_started:
        d4p.daalinit()
        atexit.register(d4p.daalfini)
        _mpi_started = True


def fit_daal4py(
    X: np.ndarray, n_clusters: int, init: str | np.ndarray, max_iter: int, tol: float, random_state: int | None
) -> KMeansFit:
    """Cluster this rank's ``X`` with oneDAL (SPMD over the job's MPI ranks when there are several).

    An array ``init`` comes checked by the estimator (shape, and the data's dtype).
    """
    d4p = load()
    spmd = spmd_ranks() > 1
    if spmd:
        start_mpi(d4p)
    X = np.ascontiguousarray(X if X.dtype in (np.float32, np.float64) else X.astype(np.float64))
    fptype = "float" if X.dtype == np.float32 else "double"
    k = n_clusters
    started = time.perf_counter()
    if isinstance(init, str):
        seed = random_state if random_state is not None else 0
        initializer = d4p.kmeans_init(
            k, fptype=fptype, method=INIT_METHODS[init], distributed=spmd, engine=d4p.engines_mt19937(seed=seed)
        )
        centroids = initializer.compute(X).centroids
    else:
        centroids = np.ascontiguousarray(init, dtype=X.dtype)
    init_done = time.perf_counter()
    result = d4p.kmeans(k, max_iter, fptype=fptype, accuracyThreshold=tol, distributed=spmd).compute(X, centroids)
    loop_done = time.perf_counter()
    labels = d4p.kmeans(k, 0, fptype=fptype, assignFlag=True).compute(X, result.centroids).assignments
    iterations = int(np.asarray(result.nIterations).ravel()[0])
    return KMeansFit(
        cluster_centers=np.asarray(result.centroids, dtype=X.dtype),
        labels=np.asarray(labels).ravel().astype(np.int64),
        inertia=float(np.asarray(result.objectiveFunction).ravel()[0]),
        n_iter=iterations,
        timings=timings(init_done - started, loop_done - init_done, iterations, total=time.perf_counter() - started),
    )
