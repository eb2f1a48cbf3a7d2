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
on the 128-feature mixture, and its first 8 passes took 1.38× scikit-learn's time.)
While the GEMM is the faster, the compiled pass's time falls as its bounds skip more rows, and it is
predicted before each pass rather than tried: the bounds' own test counts the rows the pass would
score (:meth:`~dlscale.kmeans.hamerly.HamerlyPass.rows_to_score`, a read of four numbers a row: 0.4
ms for 120,000 rows here; beyond :data:`COUNT_ROWS` rows, on a tile in every few), times its cost
per row scored (from the estimate, then from its last pass), plus the test's own time; it runs when
that beats the GEMM. (Before, it was timed again every 9th pass: on the mixture its bounds left a
fifth of the rows from the 5th pass on, and the GEMM went on scoring every row at 14 ms a pass where
the compiled pass took 9; docs/benchmarks.md, "Counting what the bounds skip".) The GEMM's time does
not fall (it scores every row), so once the compiled pass is the faster the GEMM is not timed again;
but where the GEMM scores every row faster than the compiled loop would, the compiled pass tests its
bounds on every pass rather than score every row by its own rule (:attr:`HamerlyPass.MIN_SKIPPED
<dlscale.kmeans.hamerly.HamerlyPass>`: on the blobs that rule once cost a 73-ms pass where the GEMM
took 60). A timing that included numba's compiling (or loading from its cache) is taken again.

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
#: Rows the compiled arithmetic scores to estimate its pass (spread evenly over the data).
SAMPLE_ROWS = 4096
#: Rows whose bounds are counted before a pass, at most (beyond them, a tile of rows in every few: on 400,000 rows
#: the count of every row took 0.9 ms a pass, 3% of the pass, where the bounds skipped none)
COUNT_ROWS = 65_536


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
        #: seconds the compiled pass takes per row it scores (from the estimate, then from its last pass)
        self.per_row: float | None = None
        self._test_seconds = 0.0

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
        kind, test_bounds = self._pick(centers, previous, labels)
        compiled_before = _compiled_versions(self.bounds.loops)
        scored_before = self.bounds.scored
        started = time.perf_counter()
        if kind == "blas":
            changed = self.blas.run(centers, labels, sums, totals)
        else:
            changed = self.bounds.run(centers, previous, labels, sums, totals, test_bounds=test_bounds)
        seconds = time.perf_counter() - started
        self.seconds[kind] = seconds if _compiled_versions(self.bounds.loops) == compiled_before else None
        self.passes[kind] += 1
        scored = self.bounds.scored - scored_before
        if kind == "compiled" and self.seconds["compiled"] is not None and scored > 0:
            # (what the pass took beyond testing the bounds, which the count's time stands for, per row it scored)
            self.per_row = max(seconds - self._test_seconds, 0.0) / scored
        if kind == "blas" and self.seconds["blas"] is not None and self.passes["compiled"] == 0:
            if self.choice == "auto" and self.estimated is None:
                self.estimated = self.estimate_compiled(centers)
                self.seconds["compiled"] = self.estimated
                if self.estimated is not None:
                    self.per_row = self.estimated / len(self.bounds.x)
        return changed

    def predict_compiled(self, centers: torch.Tensor, previous: torch.Tensor, labels: torch.Tensor) -> float | None:
        """Seconds the compiled pass would take now: its cost per row scored (:attr:`per_row`) times the rows its
        bounds would leave, counted (on :data:`COUNT_ROWS` rows at most, scaled), plus what testing every row's
        bounds costs (the count's own time, scaled the same way). None before its cost per row is known."""
        if self.per_row is None:
            return None
        compiled_before = _compiled_versions(self.bounds.loops)
        every = max(1, len(self.bounds.x) // COUNT_ROWS)  # (one tile of rows in every so many)
        started = time.perf_counter()
        rows = self.bounds.rows_to_score(centers, previous, labels, every)
        seconds = time.perf_counter() - started
        self._test_seconds = every * seconds if _compiled_versions(self.bounds.loops) == compiled_before else 0.0
        return self._test_seconds + self.per_row * rows

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

    def _pick(self, centers: torch.Tensor, previous: torch.Tensor | None, labels: torch.Tensor) -> tuple[Kind, bool]:
        """The kind to run now, and whether the compiled pass is to test its bounds whatever its own rule says
        (chosen on a count of the rows they leave, or where the GEMM scores every row the faster)."""
        self._test_seconds = 0.0  # (what testing every row's bounds costs, where this pick counted them)
        if self.choice != "auto":
            return self.choice, False  # type: ignore[return-value]
        untimed = [kind for kind in KINDS if self.seconds[kind] is None]
        if untimed:
            return untimed[0], False
        if self.seconds["compiled"] <= self.seconds["blas"]:
            # (The GEMM's time does not fall: it is not timed again.) Where the GEMM scores every row faster than the
            # compiled loop would, the compiled pass never scores every row itself: it tests its bounds each time.
            whole = self.per_row is not None and self.per_row * len(self.bounds.x) > self.seconds["blas"]
            return "compiled", whole
        # The GEMM was the faster when last timed; the compiled pass gets cheaper as its bounds skip rows.
        predicted = self.predict_compiled(centers, previous, labels)
        if predicted is not None and predicted < self.seconds["blas"]:
            return "compiled", True
        return "blas", False


def _compiled_versions(loops) -> int:
    """How many compiled versions the loops have in this process (it grows when a call compiles or loads one)."""
    names = ("lloyd_pass", "blas_pass", "nearest_two_of_rows", "rows_to_score")
    return sum(len(getattr(loops, name).signatures) for name in names)
