"""Lloyd's pass on CPUs, chosen per fit by time: the compiled loop or the BLAS GEMM.

Which is faster depends on the CPU (its SIMD, its BLAS), on the number of features and clusters,
and on how many rows the bounds skip by then: with a photo's 3 colours the compiled loop is
several times faster; at 128 features a GEMM can be twice as fast; and the compiled pass gets
cheaper as the fit settles and its bounds skip more rows. No constant tuned on one machine
holds across them (docs/benchmarks.md), so a fit times both: the first pass by the GEMM (every
row is scored on a first pass whichever runs), the second by the compiled loop, then the one
that took less time. While the GEMM is the faster, the compiled pass is timed again every 9th
pass: its time falls as its bounds skip more rows (on the 128-feature mixture that made the fit to
convergence 0.87× scikit-learn's time instead of 1.00×, docs/benchmarks.md). The GEMM's time does not
fall (it scores every row), so it is not timed again. A timing that included numba's compiling
(or loading from its cache) is taken again.

Both give the same labels and bit for bit the same sums (:mod:`dlscale.kmeans.blas_pass`), so
the choice, which timing noise can change from run to run, never changes a fit's result.
"""

from __future__ import annotations

import time
from typing import Literal

import torch

from dlscale.kmeans.blas_pass import BlasPass
from dlscale.kmeans.hamerly import HamerlyPass

Kind = Literal["blas", "compiled"]
#: The order in which a fit first times them: the GEMM first, on the pass that scores every row.
KINDS: tuple[Kind, ...] = ("blas", "compiled")
#: Passes by BLAS, while it is the faster, before the compiled pass is timed again.
PROBE_AFTER = 8


class CpuPass:
    """The pass of one fit on CPUs: ``choice`` "auto" (by time), "blas" or "compiled"."""

    def __init__(self, x: torch.Tensor, weights: torch.Tensor | None, chunk: int, choice: str = "auto"):
        self.bounds = HamerlyPass(x, weights)
        self.blas = BlasPass(self.bounds, chunk)
        self.choice = choice
        #: each kind's seconds, the last time it ran (None: not yet timed)
        self.seconds: dict[str, float | None] = dict.fromkeys(KINDS)
        #: passes each kind ran
        self.passes: dict[str, int] = dict.fromkeys(KINDS, 0)
        self._since_probe = 0

    @property
    def scored(self) -> int:
        """Rows scored over the fit (each against every centre)."""
        return self.bounds.scored

    @property
    def name(self) -> str:
        """The kind that ran most of the passes (the GEMM on a tie)."""
        return max(KINDS, key=lambda kind: self.passes[kind])

    def run(
        self,
        centers: torch.Tensor,
        previous: torch.Tensor | None,
        labels: torch.Tensor,
        sums: torch.Tensor,
        totals: torch.Tensor,
    ) -> int:
        """One pass after the centres moved from ``previous`` (None: the first): as
        :meth:`HamerlyPass.run <dlscale.kmeans.hamerly.HamerlyPass.run>`, by the kind chosen now."""
        kind = self._pick()
        compiled_before = _compiled_versions(self.bounds.loops)
        started = time.perf_counter()
        if kind == "blas":
            changed = self.blas.run(centers, labels, sums, totals)
        else:
            changed = self.bounds.run(centers, previous, labels, sums, totals)
        seconds = time.perf_counter() - started
        self.seconds[kind] = seconds if _compiled_versions(self.bounds.loops) == compiled_before else None
        self.passes[kind] += 1
        return changed

    def _pick(self) -> Kind:
        if self.choice != "auto":
            return self.choice  # type: ignore[return-value]
        untimed = [kind for kind in KINDS if self.seconds[kind] is None]
        if untimed:
            return untimed[0]
        faster = min(KINDS, key=lambda kind: self.seconds[kind])
        if faster == "compiled":
            return faster
        self._since_probe += 1
        if self._since_probe <= PROBE_AFTER:
            return faster
        self._since_probe = 0
        return "compiled"


def _compiled_versions(loops) -> int:
    """How many compiled versions the loops have in this process (it grows when a call compiles or loads one)."""
    return sum(
        len(getattr(loops, name).signatures)
        for name in ("lloyd_pass", "nearest_two_of_scores", "nearest_two_of_rows", "apply_labels")
    )
