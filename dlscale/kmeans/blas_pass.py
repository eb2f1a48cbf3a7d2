"""Lloyd's pass on CPUs by BLAS: every row scored by a GEMM, with the labels and sums the compiled pass gives.

At many features a GEMM (a block of rows against the centres) does a distance's arithmetic faster
than the compiled loop over features: BLAS blocks for the caches and registers, the loop cannot
(docs/benchmarks.md). So one compiled loop (:func:`dlscale.kmeans.compiled.blas_pass`) takes the
rows 128 at a time, scores each block by one GEMM, and settles a group of blocks' rows while they
and their scores are in cache, as scikit-learn's Lloyd does. (Before, torch's GEMM of a whole
chunk wrote its scores to memory and two more passes read them back: 1.31× scikit-learn's time
over the first 8 passes on the 128-feature mixture, 1.10× now; docs/benchmarks.md, "The fused
BLAS pass".) The GEMM's sums are in another order than the compiled loop's, so its values differ
in the last bits, and a row whose two nearest centres are that close could be labelled otherwise. So:

- **Near ties are scored again** by the compiled loop's arithmetic: a row whose two smallest GEMM
  values are within twice the rounding bound of both computations (:func:`hamerly.slack_scale`)
  of each other. Every other row's nearest centre is one no rounding can reverse, so the labels
  are the compiled pass's, and ``predict`` (compiled) returns them.
- **The sums are moved** with the compiled pass's split of the rows into parts and its order
  within each, so the float64 sums are bit for bit the compiled pass's.
- **The bounds are set afresh** for every row (both nearest values are at hand), so the compiled
  pass can take over at the next iteration.

The GEMM is SciPy's BLAS, which numba's ``np.dot`` calls; each thread of the loop calls it on its
own block, so the BLAS's own threads are limited to one meanwhile (by threadpoolctl, as
scikit-learn does: without it OpenBLAS starts its threads inside each of the loop's and warns
that this can hang). SciPy and threadpoolctl come with scikit-learn, in the ``kmeans`` extra;
without them the compiled pass runs alone. Which of the two passes runs is chosen per pass, from counted
work and a ratio of their costs probed once a fit (:mod:`dlscale.kmeans.cpu_pass`).
"""

from __future__ import annotations

import functools

import torch

from dlscale.errors import importable
from dlscale.kmeans import compiled_scoring
from dlscale.kmeans.hamerly import HamerlyPass


def available() -> bool:
    """Whether the BLAS pass can run here: numba's ``np.dot`` needs SciPy, and its threads threadpoolctl."""
    return compiled_scoring.available() and importable("scipy.linalg.cython_blas") and importable("threadpoolctl")


@functools.cache
def _blas_threads():
    """A threadpoolctl controller that sees SciPy's BLAS (loaded first: a controller sees the libraries loaded before
    it was made)."""
    import scipy.linalg.cython_blas  # noqa: F401  (the BLAS that numba's np.dot calls)
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def limited_blas():
    """A context in which the BLAS runs one thread per call (each thread of the BLAS pass calls it on its own block)."""
    return _blas_threads().limit(limits=1, user_api="blas")


class BlasPass:
    """The GEMM pass over a fit's rows, sharing the bounds of its :class:`~dlscale.kmeans.hamerly.HamerlyPass`."""

    def __init__(self, bounds: HamerlyPass):
        self.bounds = bounds
        #: rows scored again by the compiled arithmetic (near ties), over the fit
        self.rescored = 0

    def run(self, centers: torch.Tensor, labels: torch.Tensor, sums: torch.Tensor, totals: torch.Tensor) -> int:
        """One pass: relabel every row, move the changed ones between ``sums`` and ``totals`` (float64, in place)
        and return how many changed."""
        bounds = self.bounds
        x, k, d = bounds.x, *centers.shape
        cm2, c_sq = compiled_scoring.formula(centers)
        c_max = float((centers.double() ** 2).sum(1).max())
        part_sums, part_totals = bounds.part_sums(k, d)
        changed, near = (torch.zeros(bounds.parts, dtype=torch.int64) for _ in range(2))
        with limited_blas():
            bounds.loops.blas_pass(
                x.numpy(),
                bounds.weights.numpy(),
                cm2.numpy(),
                c_sq.numpy(),
                c_max,
                labels.numpy(),
                bounds.upper.numpy(),
                bounds.lower.numpy(),
                bounds.x_sq.numpy(),
                bounds.scale,
                # Each value is within scale·(‖x‖² + ‖c‖²) of the exact one, by either arithmetic: a winner ahead by
                # more than twice that on both sides cannot lose under the compiled loop's rounding.
                4 * bounds.scale,
                part_sums.numpy(),
                part_totals.numpy(),
                changed.numpy(),
                near.numpy(),
            )
        sums += part_sums.sum(0)
        totals += part_totals.sum(0)
        rescored = int(near.sum())
        self.rescored += rescored
        bounds.scored += len(x) + rescored
        return int(changed.sum())
