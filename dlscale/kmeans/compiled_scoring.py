"""Scoring on CPUs by compiled loops (numba, in the ``kmeans`` extra): each row's nearest centre, the inertia,
and the set-up the bounded pass of :mod:`dlscale.kmeans.hamerly` shares with them.

Every compiled call scores a distance by the GEMM formula's arithmetic, ``‖c‖² − 2·x·c`` in the data's
precision, so the fit, ``predict`` and ``score`` round a row's distances the same way. The loops
themselves are in :mod:`dlscale.kmeans.compiled`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import ModuleType

import torch

from dlscale.errors import importable

#: Parts the rows are split into for the threads: each keeps its own float64 sums. At least
#: this many, so the order of the sums (their last bits) does not depend on up to 16 threads.
MIN_PARTS = 64


def available() -> bool:
    """Whether the compiled loops can run here (numba is installed: the ``kmeans`` extra)."""
    return importable("numba")


def loops() -> ModuleType:
    """The compiled loops, numba's threads set up first (imported here: numba is optional)."""
    import numba

    if "NUMBA_THREADING_LAYER" not in os.environ:
        # OpenMP first, as torch's own threads: beside torch's OpenMP threads, still spinning after
        # its last call, numba's TBB or workqueue threads made each pass twice as slow here
        # (docs/benchmarks.md). It takes effect at the process's first parallel call.
        numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]
    from dlscale.kmeans import compiled

    # numba's own pool, sized as torch's (the kit's thread choice for this process)
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
    return compiled


@contextlib.contextmanager
def free_cpus_for_a_fit(device: torch.device) -> Iterator[int]:
    """torch's threads, which the compiled loops and the BLAS pass follow, for one fit on a CPU: a thread for each CPU
    free at its start (:func:`~dlscale.runtime.threads.threads_now`), put back after; yields the count.

    Beside one busy process on 2 CPUs (Zen 5), two threads let the loops wait at each pass's end for the thread that
    shares its CPU: the first 8 iterations of the mixture took 0.25-0.42 s (0.93-1.72× scikit-learn, six runs), one
    thread 0.26-0.31 s (0.81-1.12×)."""
    if device.type != "cpu":
        yield torch.get_num_threads()
        return
    from dlscale.runtime.threads import threads_now

    kept, count = torch.get_num_threads(), threads_now().count
    if count != kept:
        torch.set_num_threads(count)
    try:
        yield count
    finally:
        if torch.get_num_threads() != kept:
            torch.set_num_threads(kept)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """The compiled loops on this thread alone meanwhile (numba's count put back after)."""
    import numba

    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(threads)


def weights_for_loops(weights: torch.Tensor | None) -> torch.Tensor:
    """Contiguous float64 weights, or an empty array for weights of one (as the compiled loops read them)."""
    return torch.empty(0, dtype=torch.float64) if weights is None else weights.double().contiguous()


def parts(rows: int) -> int:
    """How many parts the rows are split into for the threads (see :data:`MIN_PARTS`)."""
    return max(1, min(rows, max(MIN_PARTS, 4 * torch.get_num_threads())))


def formula(centers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``−2·c`` and ``‖c‖²`` in the data's precision: the distance of x to c is ``‖c‖² + Σ x·(−2c)`` (+ ‖x‖²)."""
    return (-2 * centers).contiguous(), (centers * centers).sum(1)


def nearest(x: torch.Tensor, centers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's nearest centre, by the arithmetic of the bounded pass (:mod:`dlscale.kmeans.hamerly`), and its
    squared distance (float64)."""
    x = x.contiguous()
    labels = torch.empty(len(x), dtype=torch.int64)
    distance = torch.empty(len(x), dtype=torch.float64)
    cm2, c_sq = formula(centers)
    loops().nearest(x.numpy(), cm2.numpy(), c_sq.numpy(), labels.numpy(), distance.numpy())
    return labels, distance


def inertia(x: torch.Tensor, centers: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None) -> float:
    """Σ w·‖x − c_label‖² over the rows, each term and the sum in float64, by a compiled loop."""
    x = x.contiguous()
    return float(
        loops().inertia(
            x.numpy(), weights_for_loops(weights).numpy(), centers.contiguous().numpy(), labels.numpy(), parts(len(x))
        )
    )


def column_sums(x: torch.Tensor) -> torch.Tensor:
    """The sum of each column of ``x`` in float64, by a compiled loop over parts of the rows."""
    x = x.contiguous()
    return torch.from_numpy(loops().column_sums(x.numpy(), parts(len(x))))
