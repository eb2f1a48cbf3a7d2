"""Lloyd's pass on CPUs, chosen per fit by time: the compiled loop or the BLAS GEMM.

Which is faster depends on the CPU (its SIMD, its BLAS), on the number of features and clusters,
and on how many rows the bounds skip by then: with a photo's 3 colours the compiled loop is
several times faster; at 128 features a GEMM can be twice as fast; and the compiled pass gets
cheaper as the fit settles and its bounds skip more rows. No constant tuned on one machine
holds across them (docs/benchmarks.md), so a fit times both: the first pass by the GEMM (every
row is scored on a first pass whichever runs); then the compiled loop's arithmetic on 4 × 4,096
consecutive rows, in two calls whose difference leaves out the call's own cost (nothing is
changed), estimates its pass (within 10-25% of the pass here). Where the estimate beats the GEMM,
the second pass is the compiled loop, timed whole, and from then on the one that took less time.
(Before the estimate the second pass was always the compiled loop: 26 ms against the GEMM's 16-19
on the 128-feature mixture, and its first 8 passes took 1.38× scikit-learn's time; 1.23-1.25× now.)
While the GEMM is the faster, the compiled pass is timed again every 9th pass: its time falls as
its bounds skip more rows (on the mixture that made the fit to convergence 0.87× scikit-learn's
time instead of 1.00×, docs/benchmarks.md). The GEMM's time does not fall (it scores every row),
so it is not timed again. A timing that included numba's compiling (or loading from its cache) is
taken again.

Both give the same labels and bit for bit the same sums (:mod:`dlscale.kmeans.blas_pass`), so
the choice, which timing noise can change from run to run, never changes a fit's result.
"""

from __future__ import annotations

import time
from typing import Literal

import torch

from dlscale.errors import import_optional
from dlscale.kmeans import blas_pass, compiled_scoring
from dlscale.kmeans.blas_pass import BlasPass
from dlscale.kmeans.errors import KMeansError
from dlscale.kmeans.hamerly import HamerlyPass

Kind = Literal["blas", "compiled"]
#: The order in which a fit first times them: the GEMM first, on the pass that scores every row.
KINDS: tuple[Kind, ...] = ("blas", "compiled")
#: Passes by BLAS, while it is the faster, before the compiled pass is timed again.
PROBE_AFTER = 8
#: Rows the compiled arithmetic scores to estimate its pass (spread evenly over the data).
SAMPLE_ROWS = 4096


class CpuPass:
    """The pass of one fit on CPUs: ``choice`` "auto" (by time), "blas" or "compiled" ("auto" is "compiled" where the
    BLAS pass cannot run: without SciPy or threadpoolctl)."""

    def __init__(self, x: torch.Tensor, weights: torch.Tensor | None, choice: str = "auto"):
        self.bounds = HamerlyPass(x, weights)
        self.blas = BlasPass(self.bounds)
        if not blas_pass.available():
            if choice == "blas":
                for module in ("scipy", "threadpoolctl"):
                    import_optional(module, "kmeans", "K-Means's BLAS pass (cpu_pass=blas)", KMeansError)
            choice = "compiled"
        self.choice = choice
        #: each kind's seconds, the last time it ran (None: not yet timed)
        self.seconds: dict[str, float | None] = dict.fromkeys(KINDS)
        #: passes each kind ran
        self.passes: dict[str, int] = dict.fromkeys(KINDS, 0)
        #: the compiled pass's time estimated from a sample, before it first ran (None: not estimated)
        self.estimated: float | None = None
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
        if kind == "blas" and self.seconds["blas"] is not None and self.passes["compiled"] == 0:
            if self.choice == "auto" and self.estimated is None:
                self.estimated = self.estimate_compiled(centers)
                self.seconds["compiled"] = self.estimated
        return changed

    def estimate_compiled(self, centers: torch.Tensor) -> float | None:
        """Seconds the compiled loop would take to score every row, from timing it on :data:`SAMPLE_ROWS` rows spread
        over the data (nothing written but scratch; None where the call compiled, or loaded, the loop)."""
        x, loops = self.bounds.x, self.bounds.loops
        if len(x) < 4 * SAMPLE_ROWS:  # (a small fit: the compiled pass is timed whole)
            return None
        # (consecutive rows, as the pass reads them: rows spread over the data cost a cache miss each, and made the
        # estimate 1.5-2.5x the pass; what a row costs does not depend on its values: the loop has no branches)
        rows = torch.arange(len(x) // 2 - SAMPLE_ROWS, len(x) // 2 + 2 * SAMPLE_ROWS)
        cm2, c_sq = compiled_scoring.formula(centers)
        best = torch.empty(len(rows), dtype=torch.int32)
        first, second = (torch.empty(len(rows), dtype=x.dtype) for _ in range(2))
        compiled_before = _compiled_versions(loops)

        def timed(count: int) -> float:
            started = time.perf_counter()
            loops.nearest_two_of_rows(
                x.numpy(), rows[:count].numpy(), cm2.numpy(), c_sq.numpy(), best.numpy(), first.numpy(), second.numpy()
            )
            return time.perf_counter() - started

        # Two calls, of one sample and of three: their difference is the rows' own time, without the call's fixed
        # cost (waking the threads: 0.5 ms here, as much as scoring 4,096 rows of 32 features).
        once, twice = timed(SAMPLE_ROWS), timed(3 * SAMPLE_ROWS)
        if _compiled_versions(loops) != compiled_before or twice <= once:
            return None  # (compiled or loaded meanwhile, or a busy machine's noise: the pass is timed whole)
        return (twice - once) * len(x) / (2 * SAMPLE_ROWS)

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
    return sum(len(getattr(loops, name).signatures) for name in ("lloyd_pass", "blas_pass", "nearest_two_of_rows"))
