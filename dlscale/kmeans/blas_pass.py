"""Lloyd's pass on CPUs by BLAS: every row scored by a GEMM, with the labels and sums the compiled pass gives.

At many features a GEMM (the rows of a chunk against the centres, in the BLAS torch uses) does a
distance's arithmetic faster than the compiled loop over features: BLAS blocks for the caches and
registers, the loop cannot (docs/benchmarks.md). Its sums are in another order, though, so its
values differ from the compiled loop's in the last bits, and a row whose two nearest centres are
that close could be labelled otherwise. So:

- **Near ties are scored again** by the compiled loop's arithmetic: a row whose two smallest GEMM
  values are within twice the rounding bound of both computations (:func:`hamerly.slack_scale`)
  of each other. Every other row's nearest centre is one no rounding can reverse, so the labels
  are the compiled pass's, and ``predict`` (compiled) returns them.
- **The sums are moved by a compiled loop** with the compiled pass's split of the rows into parts
  and its order within each, so the float64 sums are bit for bit the compiled pass's.
- **The bounds are set afresh** for every row (both nearest values are at hand), so the compiled
  pass can take over at the next iteration.

Which of the two passes runs is chosen by time, per fit (:mod:`dlscale.kmeans.cpu_pass`).
"""

from __future__ import annotations

import torch

from dlscale.kmeans import compiled_scoring
from dlscale.kmeans.hamerly import HamerlyPass


class BlasPass:
    """The GEMM pass over a fit's rows, sharing the bounds of its :class:`~dlscale.kmeans.hamerly.HamerlyPass`."""

    def __init__(self, bounds: HamerlyPass, chunk: int):
        self.bounds = bounds
        self.chunk = chunk
        n = len(bounds.x)
        self.best = torch.empty(n, dtype=torch.int32)
        self.first = torch.empty(n, dtype=bounds.x.dtype)
        self.second = torch.empty(n, dtype=bounds.x.dtype)
        self.near = torch.empty(n, dtype=torch.bool)
        #: rows scored again by the compiled arithmetic (near ties), over the fit
        self.rescored = 0

    def run(self, centers: torch.Tensor, labels: torch.Tensor, sums: torch.Tensor, totals: torch.Tensor) -> int:
        """One pass: relabel every row, move the changed ones between ``sums`` and ``totals`` (float64, in place)
        and return how many changed."""
        bounds, loops = self.bounds, self.bounds.loops
        x, k, d = bounds.x, *centers.shape
        cm2, c_sq = compiled_scoring.formula(centers)
        c_max = float((centers.double() ** 2).sum(1).max())
        # Each value is within scale·(‖x‖² + ‖c‖²) of the exact one, by either arithmetic: a winner ahead by
        # more than twice that on both sides cannot lose under the compiled loop's rounding.
        tie_scale = 4 * bounds.scale
        block = torch.empty(min(self.chunk, len(x)) * k, dtype=x.dtype)
        for start in range(0, len(x), self.chunk):
            rows = x[start : start + self.chunk]
            scores = torch.addmm(c_sq, rows, centers.T, alpha=-2, out=block[: len(rows) * k].view(len(rows), k))
            end = start + len(rows)
            loops.nearest_two_of_scores(
                scores.numpy(),
                bounds.x_sq[start:end].numpy(),
                tie_scale,
                c_max,
                *(t[start:end].numpy() for t in (self.best, self.first, self.second, self.near)),
            )
        near = torch.nonzero(self.near).squeeze(1)
        if len(near):
            best, first, second = (torch.empty(len(near), dtype=t.dtype) for t in (self.best, self.first, self.second))
            loops.nearest_two_of_rows(
                x.numpy(), near.numpy(), cm2.numpy(), c_sq.numpy(), best.numpy(), first.numpy(), second.numpy()
            )
            self.best[near], self.first[near], self.second[near] = best, first, second
            self.rescored += len(near)
        part_sums = torch.zeros(bounds.parts, k, d, dtype=torch.float64)
        part_totals = torch.zeros(bounds.parts, k, dtype=torch.float64)
        changed = torch.zeros(bounds.parts, dtype=torch.int64)
        loops.apply_labels(
            x.numpy(),
            bounds.weights.numpy(),
            self.best.numpy(),
            self.first.numpy(),
            self.second.numpy(),
            labels.numpy(),
            bounds.upper.numpy(),
            bounds.lower.numpy(),
            bounds.x_sq.numpy(),
            bounds.scale,
            bounds.scale * c_max,
            part_sums.numpy(),
            part_totals.numpy(),
            changed.numpy(),
        )
        sums += part_sums.sum(0)
        totals += part_totals.sum(0)
        bounds.scored += len(x) + len(near)
        return int(changed.sum())
