"""Lloyd's pass on CPUs, chosen per fit from counted work: the compiled loop or the BLAS GEMM.

Which is faster depends on the CPU (its SIMD, its BLAS), on the number of features and clusters,
and on how many rows the bounds skip by then: with a photo's 3 colours the compiled loop is
several times faster; at 128 features a GEMM can be twice as fast; and the compiled pass gets
cheaper as the fit settles and its bounds skip more rows. No constant tuned on one machine
holds across them (docs/benchmarks.md), so each fit measures one number, the **ratio** of the two
passes' costs per row scored, and decides every pass from counted work:

- **The ratio is probed on the same rows, in alternation.** Before the first pass each pass's own loop
  scores a block of consecutive rows and a block three times as large (scratch copies of the state:
  nothing of the fit is written), on one thread, the two passes taking turns, for :data:`PROBE_ROUNDS`
  rounds, and more rounds of a pass whose probes are not yet settled (:func:`settled`: the two fastest
  rounds of each block agree, and the larger block took about three times the smaller), up to
  :data:`PROBE_MAX_ROUNDS` and :data:`PROBE_BUDGET`. Each probe's time is the fastest of its rounds,
  because a neighbour only ever slows a probe; the difference of the two blocks' times leaves out a
  call's fixed cost. The smaller block holds about :data:`PROBE_WORK` multiply-adds, a tenth of a
  millisecond: a probe that short, on one thread, runs between a neighbour's time slices or beside it on
  the other core, where a whole pass on every thread cannot. (Before, one GEMM pass timed whole was
  compared with the compiled loop timed once on a sample: beside one busy process one burst in that
  sample made the photos' colours run the GEMM at 2.1× scikit-learn's time, against 0.5-0.65× quiet.)
- **The first pass** (every row scored, whichever runs) is the one whose rows cost less.
- **Where the compiled loop scores every row as fast as the GEMM** (the ratio ≥ 1), it runs every pass,
  skipping rows by its own rule; the GEMM's time does not fall (it scores every row), so nothing is
  timed again.
- **Where the GEMM is faster per row**, the compiled pass gets cheaper as its bounds skip more rows, and
  the bounds' own test counts the rows it would score before each pass
  (:meth:`~dlscale.kmeans.hamerly.HamerlyPass.rows_to_score`, a read of four numbers a row: 0.4 ms for
  120,000 rows here; beyond :data:`COUNT_ROWS` rows, on a tile in every few). The compiled pass runs,
  testing its bounds, when those rows plus the test's own cost come to fewer than the ratio × all rows
  (the GEMM's work in the compiled loop's rows): a comparison of counts, which no neighbour's burst can
  turn. (The test's cost is timed, in rows of the last pass's rate.) Once a compiled pass took less
  time than a GEMM pass would now, it runs again without a count (its bounds only skip more). (Before
  the count, the compiled pass was timed again every 9th pass: on the mixture its bounds left a fifth of
  the rows from the 5th pass on, and the GEMM went on scoring every row at 14 ms a pass where the
  compiled pass took 9; docs/benchmarks.md, "Counting what the bounds skip".)
- **A re-check**: where a pass of one kind follows one of the other, the time the ratio predicted for it
  (from the other's measured rate) is compared with what it took; more than :data:`RECHECK` × longer, and
  the ratio is probed again (more rounds, the fastest of all kept), at most :data:`MAX_RECHECKS` times a
  fit.

A fit of fewer than 4 × :data:`SAMPLE_ROWS` rows is not probed: its first pass is the GEMM's, its second
the compiled loop's, each timed whole, and the ratio is theirs. A timing that included numba's compiling
(or loading from its cache) is taken again.

Both give the same labels and bit for bit the same sums (:mod:`dlscale.kmeans.blas_pass`), so
the choice, which timing noise can change from run to run, never changes a fit's result.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Literal

import numpy as np
import torch

from dlscale.errors import import_optional
from dlscale.kmeans import blas_pass, compiled_scoring
from dlscale.kmeans.blas_pass import BlasPass
from dlscale.kmeans.errors import KMeansError
from dlscale.kmeans.hamerly import HamerlyPass

Kind = Literal["blas", "compiled"]
#: The order in which a fit without a probe first times them: the GEMM first, on the pass that scores every row.
KINDS: tuple[Kind, ...] = ("blas", "compiled")
#: A fit of fewer than 4 × this many rows is not probed (its passes are timed whole).
SAMPLE_ROWS = 4096
#: Multiply-adds (rows × clusters × features) of the smaller probe block: 0.05-0.3 ms of either loop on one thread here.
PROBE_WORK = 1 << 16
#: Rows of the smaller probe block, at least and at most (the larger holds three times as many).
PROBE_ROWS = (512, 4096)
#: Rounds of probes, at least and at most: more of a pass's probes while they are not :func:`settled` (the two fastest
#: rounds of a block differ by more than :data:`PROBE_AGREE`: a neighbour's burst slowed one of them).
PROBE_ROUNDS = 2
PROBE_MAX_ROUNDS = 10
PROBE_AGREE = 1.15
#: Seconds of probing after which no further round starts (on a machine so busy that no two rounds agree).
PROBE_BUDGET = 0.05
#: A pass that took this many times what the ratio predicted from the other kind's last pass probes the ratio again,
#: at most :data:`MAX_RECHECKS` times a fit.
RECHECK = 1.5
MAX_RECHECKS = 2
#: Rows whose bounds are counted before a pass, at most (beyond them, a tile of rows in every few: on 400,000 rows
#: the count of every row took 0.9 ms a pass, 3% of the pass, where the bounds skipped none)
COUNT_ROWS = 65_536


def probe_ratio(timed: Callable[[Kind, int], float], rows: int) -> tuple[float | None, dict[tuple[Kind, int], list]]:
    """The GEMM's cost per row over the compiled loop's, from ``timed(kind, rows)`` (the seconds one call of that
    pass's loop took on that many rows): each kind on ``rows`` and ``3 × rows`` in alternation (the order reversed
    every other round), :data:`PROBE_ROUNDS` rounds, then more rounds of a kind's probes until they are settled
    (:func:`settled`), within :data:`PROBE_MAX_ROUNDS` and :data:`PROBE_BUDGET`; each probe's fastest round counts.
    Returns the ratio (None where a larger block did not take longer: noise beyond the rounds) and every round's
    times."""
    rounds: dict[tuple[Kind, int], list[float]] = {(kind, size): [] for kind in KINDS for size in (rows, 3 * rows)}
    spent = 0.0
    for done in range(1, PROBE_MAX_ROUNDS + 1):
        keys = [key for key in rounds if done <= PROBE_ROUNDS or not settled(rounds, key[0], rows)]
        if not keys or (done > PROBE_ROUNDS and spent > PROBE_BUDGET):
            break
        for key in keys if done % 2 else keys[::-1]:
            rounds[key].append(timed(*key))
            spent += rounds[key][-1]
    return ratio_of(rounds, rows), rounds


def settled(rounds: dict[tuple[Kind, int], list[float]], kind: Kind, rows: int) -> bool:
    """Whether a kind's probes look unslowed: the two fastest rounds of each block agree within :data:`PROBE_AGREE`,
    and the larger block took 1.5-3.15× the smaller (3× the rows and one fixed cost: a burst on the smaller block
    makes it less, on the larger more; two bursts of a time slice each, about 1×)."""
    small, large = rounds[(kind, rows)], rounds[(kind, 3 * rows)]
    return _agree(small) and _agree(large) and 1.5 * min(small) <= min(large) <= 3.15 * min(small)


def ratio_of(rounds: dict[tuple[Kind, int], list[float]], rows: int) -> float | None:
    """The ratio of :func:`probe_ratio` from its rounds: per kind, the fastest larger block less the fastest smaller
    one (a call's fixed cost left out), over ``2 × rows``."""
    per_row = {kind: (min(rounds[(kind, 3 * rows)]) - min(rounds[(kind, rows)])) / (2 * rows) for kind in KINDS}
    if min(per_row.values()) <= 0:
        return None
    return per_row["blas"] / per_row["compiled"]


def _agree(times: list[float]) -> bool:
    if len(times) < 2:
        return False
    low, second = sorted(times)[:2]
    return second <= PROBE_AGREE * low


class CpuPass:
    """The pass of one fit on CPUs: ``choice`` "auto" (from counted work and a probed ratio), "blas" or "compiled"
    ("auto" is "compiled" where the BLAS pass cannot run: without SciPy or threadpoolctl)."""

    def __init__(self, x: torch.Tensor, weights: torch.Tensor | None, choice: str = "auto"):
        self.bounds = HamerlyPass(x, weights)
        self.blas = BlasPass(self.bounds)
        if not blas_pass.available():
            if choice == "blas":
                for module in ("scipy", "threadpoolctl"):
                    import_optional(module, "kmeans", "K-Means's BLAS pass (cpu_pass=blas)", KMeansError)
            choice = "compiled"
        self.choice = choice
        #: the GEMM's cost per row over the compiled loop's, scoring every row (None: not known yet)
        self.ratio: float | None = None
        #: each probe's times over the fit, {(kind, rows): [seconds per round]}
        self.probes: dict[tuple[Kind, int], list[float]] = {}
        self.rechecks = 0
        #: each kind's seconds, the last time it ran (None: not yet timed)
        self.seconds: dict[str, float | None] = dict.fromkeys(KINDS)
        #: passes each kind ran
        self.passes: dict[str, int] = dict.fromkeys(KINDS, 0)
        #: seconds the compiled pass takes per row it scores, at the last pass's pace (the GEMM's through the ratio)
        self.per_row: float | None = None
        self._test_seconds = 0.0
        self._test_rate = math.inf  # (seconds a row of the fastest count of the bounds took)
        self._last: Kind | None = None
        self._predicted: float | None = None  # (the seconds the ratio predicted for this pass, from the other kind)

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
        timed = _compiled_versions(self.bounds.loops) == compiled_before
        self.seconds[kind] = seconds if timed else None
        self.passes[kind] += 1
        if timed:
            self._learn(kind, seconds, self.bounds.scored - scored_before, centers, labels)
        return changed

    def _learn(self, kind: Kind, seconds: float, scored: int, centers: torch.Tensor, labels: torch.Tensor) -> None:
        """What a timed pass tells: the compiled loop's pace per row scored (the GEMM's through the ratio); where the
        ratio predicted this pass from the other kind's and it took :data:`RECHECK` × that, the ratio probed again."""
        n = len(self.bounds.x)
        if self.ratio is None and self.seconds["blas"] is not None and kind == "compiled" and scored > 0:
            # (no probe: the ratio of the two whole passes, each per row it scored)
            self.ratio = (self.seconds["blas"] / n) / max(seconds / scored, 1e-12)
        if kind == "compiled" and scored > 0:
            # (what the pass took beyond testing the bounds, which the count's time stands for, per row it scored)
            self.per_row = max(seconds - self._test_seconds, 0.0) / scored
        elif kind == "blas" and self.ratio is not None:
            self.per_row = seconds / n / self.ratio
        predicted, self._predicted = self._predicted, None
        switched, self._last = self._last not in (None, kind), kind
        if (
            switched
            and predicted
            and seconds > RECHECK * predicted
            and self.rechecks < MAX_RECHECKS
            and self.probes
            and self.choice == "auto"
        ):
            self.rechecks += 1
            self.probe(centers, labels)

    def probe(self, centers: torch.Tensor, labels: torch.Tensor) -> float | None:
        """Probe the ratio (:func:`probe_ratio`) on a block of consecutive rows from the middle of the data, on scratch
        copies of the state (labels as they are now); rounds of earlier probes count too. None where the data are
        too few, or the probes too noisy (then the passes are timed whole)."""
        x = self.bounds.x
        n, d = x.shape
        k = len(centers)
        if n < 4 * SAMPLE_ROWS:
            return None
        tile = self.bounds.loops.TILE
        rows = min(max(PROBE_WORK // (k * d), PROBE_ROWS[0]), PROBE_ROWS[1], n // 6)
        rows = max(tile, rows - rows % tile)
        start = (n - 3 * rows) // 2
        timed = self._probe_timer(centers, labels, start, 3 * rows)
        with blas_pass.limited_blas(), compiled_scoring.one_thread():
            for kind in KINDS:  # (untimed: the threads awake, the block in cache, anything numba loads, loaded)
                timed(kind, rows)
            _, rounds = probe_ratio(timed, rows)
        for key, times in rounds.items():
            self.probes.setdefault(key, []).extend(times)
        if all(key in self.probes for key in rounds):
            self.ratio = ratio_of(self.probes, rows) or self.ratio
        return self.ratio

    def _probe_timer(self, centers: torch.Tensor, labels: torch.Tensor, start: int, most: int):
        """``timed(kind, rows)``: the seconds one call of that pass's loop takes on ``rows`` rows from ``start``,
        every row scored, on scratch copies (nothing of the fit written)."""
        bounds, loops = self.bounds, self.bounds.loops
        k, d = centers.shape
        x = bounds.x[start : start + most].numpy()
        x_sq = bounds.x_sq[start : start + most].numpy()
        weights = bounds.weights.numpy()[start : start + most] if len(bounds.weights) else bounds.weights.numpy()
        cm2, c_sq = compiled_scoring.formula(centers)
        cm2, c_sq = cm2.numpy(), c_sq.numpy()
        c_max = float((centers.double() ** 2).sum(1).max())
        now = labels[start : start + most].numpy()
        scratch = np.empty_like(now)
        upper, lower = np.empty(most), np.empty(most)
        parts = compiled_scoring.parts(-(-most // loops.TILE))
        sums, totals = np.empty((parts, k, d)), np.empty((parts, k))
        counts, zeros = np.zeros(parts, np.int64), np.zeros(k)

        def timed(kind: Kind, rows: int) -> float:
            scratch[:rows] = now[:rows]
            part = max(1, min(parts, -(-rows // loops.TILE)))
            args = (sums[:part], totals[:part], counts[:part], counts[:part].copy())
            w = weights[:rows] if len(weights) else weights
            started = time.perf_counter()
            if kind == "blas":
                loops.blas_pass(
                    x[:rows], w, cm2, c_sq, c_max, scratch[:rows], upper[:rows], lower[:rows], x_sq[:rows],
                    bounds.scale, 4 * bounds.scale, *args,
                )  # fmt: skip
            else:
                loops.lloyd_pass(
                    x[:rows], w, cm2, c_sq, scratch[:rows], upper[:rows], lower[:rows], x_sq[:rows], bounds.scale,
                    zeros, zeros, zeros, bounds.scale * c_max, 2 * bounds.scale * c_max, True, *args,
                )  # fmt: skip
            return time.perf_counter() - started

        return timed

    def predict_compiled(self, centers: torch.Tensor, previous: torch.Tensor, labels: torch.Tensor) -> float | None:
        """Seconds the compiled pass would take now: its cost per row scored (:attr:`per_row`) times the rows its
        bounds would leave, counted (on :data:`COUNT_ROWS` rows at most, scaled), plus what testing every row's
        bounds costs (the fastest count's time so far, scaled the same way: the one timing the rule reads, so a burst
        on one count is not taken for its cost). None before its cost per row is known."""
        if self.per_row is None:
            return None
        compiled_before = _compiled_versions(self.bounds.loops)
        every = max(1, len(self.bounds.x) // COUNT_ROWS)  # (one tile of rows in every so many)
        started = time.perf_counter()
        rows = self.bounds.rows_to_score(centers, previous, labels, every)
        seconds = time.perf_counter() - started
        if _compiled_versions(self.bounds.loops) == compiled_before:  # (the fastest count so far: a burst only slows)
            self._test_rate = min(self._test_rate, every * seconds / len(self.bounds.x))
        self._test_seconds = self._test_rate * len(self.bounds.x) if self._test_rate < math.inf else 0.0
        return self._test_seconds + self.per_row * rows

    def _pick(self, centers: torch.Tensor, previous: torch.Tensor | None, labels: torch.Tensor) -> tuple[Kind, bool]:
        """The kind to run now, and whether the compiled pass is to test its bounds whatever its own rule says
        (chosen on a count of the rows they leave, or where the GEMM scores every row the faster)."""
        self._test_seconds = 0.0  # (what testing every row's bounds costs, where this pick counted them)
        if self.choice != "auto":
            return self.choice, False  # type: ignore[return-value]
        if previous is None and self.ratio is None:
            self.probe(centers, labels)
        if self.ratio is None:  # (a small fit, or probes too noisy: each kind timed whole, the GEMM first)
            untimed = [kind for kind in KINDS if self.seconds[kind] is None]
            return (untimed[0] if untimed else "compiled"), False
        if previous is None:
            return ("compiled" if self.ratio >= 1 else "blas"), False
        if self.ratio >= 1:
            return "compiled", False  # (the GEMM's time does not fall: it is not timed again)
        # The GEMM scores every row faster: the compiled pass tests its bounds each time it runs.
        blas = self.per_row * self.ratio * len(self.bounds.x) if self.per_row is not None else None
        if self._last == "compiled" and blas is not None and self.seconds["compiled"] is not None:
            if self.seconds["compiled"] <= blas:
                return "compiled", True  # (its bounds only skip more: no count)
        predicted = self.predict_compiled(centers, previous, labels)
        if predicted is not None and blas is not None and predicted < blas:
            self._predicted = predicted if self._last == "blas" else None
            return "compiled", True
        self._predicted = blas if self._last == "compiled" else None
        return "blas", False


def _compiled_versions(loops) -> int:
    """How many compiled versions the loops have in this process (it grows when a call compiles or loads one)."""
    names = ("lloyd_pass", "blas_pass", "rows_to_score")
    return sum(len(getattr(loops, name).signatures) for name in names)
