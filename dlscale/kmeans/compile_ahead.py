"""Compile K-Means's CPU loops into numba's cache ahead of the first fit: ``python -m dlscale.kmeans.compile_ahead``.

numba compiles each loop for each kind of input (float32 or float64) at its first call and keeps the machine code in
its cache (``__pycache__`` beside the source, or
``NUMBA_CACHE_DIR``). In a fresh install every process that fits before the cache is written
compiles for itself: 20–25 s of CPU each on 2 cores, paid by each rank of a first distributed
run, each kernel of a workshop room and each test process. ``make setup-dev`` (and so ``make lab``
and ``make test``) runs this once after installing, so those processes load the code instead
(docs/testing.md; docs/benchmarks.md, "Over the budget at landing").

It fits small data sets of each kind, so it compiles exactly what a fit, ``predict`` and ``score``
call: both CPU passes (a fit of more than 4 × ``SAMPLE_ROWS`` rows probes both on a block of rows, then runs one),
the rescoring of rows tied between two centres, the initialisations and the inertia;
and it counts the rows the compiled pass's bounds would leave (what a fit does while the GEMM is the faster, which
these small fits need not reach).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from dlscale.kmeans import compiled_scoring
from dlscale.kmeans.cpu_pass import SAMPLE_ROWS


def compile_ahead() -> float:
    """Fit, predict and score once for each input kind, so numba's cache holds every loop; the seconds it took.
    (Weights need no fit of their own: the loops read weights of one as an empty float64 array, the same type.)"""
    import torch

    from dlscale.kmeans.estimator import KMeans
    from dlscale.kmeans.hamerly import HamerlyPass

    started = time.perf_counter()
    # rows of ones lie exactly halfway between the centres of zeros and of twos: the BLAS pass scores them again;
    # and enough rows that a fit probes both passes on a block of rows (cpu_pass.SAMPLE_ROWS)
    rows = np.concatenate([np.random.default_rng(0).normal(size=(4 * SAMPLE_ROWS, 8)), np.ones((64, 8))])
    tied = np.array([[0.0] * 8, [2.0] * 8, [-3.0] * 8, [5.0] * 8])
    for dtype in (np.float32, np.float64):
        x = rows.astype(dtype)
        for init in ("k-means++", "random", tied.astype(dtype)):
            # max_iter 4 and tol 0: both passes probed, then the passes the probe and the count choose
            model = KMeans(
                4, init=init, n_init=1, max_iter=4, tol=0.0, random_state=0, backend="torch", device="cpu"
            ).fit(x)
            model.predict(x)
            model.score(x)
        centers = torch.from_numpy(tied.astype(dtype))
        HamerlyPass(torch.from_numpy(x), None).rows_to_score(
            centers, centers + 1, torch.zeros(len(x), dtype=torch.int64)
        )
    return time.perf_counter() - started


def main() -> int:
    if not compiled_scoring.available():
        print("compile_ahead: numba is not installed (the kmeans extra): nothing to compile")
        return 0
    print(f"compile_ahead: K-Means's CPU loops in numba's cache ({compile_ahead():.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
