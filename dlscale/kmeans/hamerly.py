"""Lloyd's iteration on CPUs as one compiled pass: Hamerly's bounds, scoring and the sums together.

Per row, ``upper`` ≥ the distance to its centre and ``lower`` ≤ the distance to any other
(Hamerly 2010, "Making k-means even faster"). When the centres move by δ, the upper bound
grows by its centre's δ and the lower one shrinks by the largest other δ; the triangle
inequality also gives ``gap − upper`` (``gap``: from the row's centre to its nearest other
centre) as a lower bound. A row is re-scored only when the bounds leave less than twice the
rounding error of the distance formula (:func:`slack_scale`) between its centre and the
others, so every skipped row is one a full argmin would leave where it is.

Why compiled (numba, in the ``kmeans`` extra): with few features (a photo's 3 colours) the
distances are little arithmetic, and a pass made of torch calls spends its time writing
the rows × k block of distances, reading it back for the argmin, and indexing the rows the
bounds keep (docs/benchmarks.md). One loop over tiles of rows does the bounds test, the
scoring, the nearest two and the sums, with no block and no per-row Python; its arithmetic
per distance is the GEMM formula's, ``‖c‖² − 2·x·c``, in the data's precision, like
scikit-learn's.
"""

from __future__ import annotations

import math

import torch

from dlscale.kmeans import compiled_scoring


def slack_scale(dtype: torch.dtype, d: int) -> float:
    """The rounding error of a squared distance ``‖x‖² − 2·x·c + ‖c‖²`` is at most this × (‖x‖² + ‖c‖²).

    Each term is a sum of d + 2 products in the data's precision: the error is at most about
    (d + 2)·ε·(‖x‖² + ‖c‖²) (Higham's γ bound, doubled for the cross term); 4× that is kept.
    A row is skipped only when its centre wins by twice this, so no rounding can reverse it.
    """
    return 4 * (d + 2) * torch.finfo(dtype).eps


def _motion(old: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """How far each centre moved (``shift``), the largest move of any other centre (``other``), and the
    distance from each centre to its nearest other (``gap``): what loosens the bounds (float64)."""
    shift = ((new - old) ** 2).sum(1).sqrt_().mul_(1 + 1e-9)
    other = torch.zeros_like(shift)
    if len(shift) > 1:
        top = torch.topk(shift, 2)
        other.fill_(float(top.values[0]))
        other[top.indices[0]] = top.values[1]
    gap = torch.cdist(new, new).fill_diagonal_(math.inf).amin(1)
    return shift, other, gap


class HamerlyPass:
    """The per-row bounds of one fit, and the pass that uses them (CPU tensors, float32 or float64)."""

    #: When a pass's bounds skip fewer than this share of the rows, testing them costs more than it
    #: saves: the next passes score every row, and every ``PROBE_EVERY``-th pass tests the bounds again.
    MIN_SKIPPED = 0.25
    PROBE_EVERY = 4

    def __init__(self, x: torch.Tensor, weights: torch.Tensor | None):
        self.x = x.contiguous()
        self.loops = compiled_scoring.loops()
        self.scale = slack_scale(x.dtype, x.shape[1])
        # ‖x‖² only scales the rounding slack: float64 of the data's values is plenty
        self.x_sq = torch.empty(len(x), dtype=torch.float64)
        self.loops.squared_norms(self.x.numpy(), self.x_sq.numpy())
        self.upper = torch.full_like(self.x_sq, math.inf)
        self.lower = torch.zeros_like(self.x_sq)
        self.parts = compiled_scoring.parts(-(-len(x) // self.loops.TILE))  # (in whole tiles)
        #: rows scored so far (each against every centre): how much of the work the bounds saved
        self.scored = 0
        self._passes_scoring_all = 0  # since the bounds last skipped too few rows (0: they pay)
        self.weights = compiled_scoring.weights_for_loops(weights)  # (as the loops read them)
        self._part_sums: torch.Tensor | None = None
        self._part_totals: torch.Tensor | None = None

    def part_sums(self, k: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each part's sums and totals (float64), which the passes' loops zero and fill: one pair for the fit (2.6 MB
        at 64 parts, 40 clusters and 128 features, which a new allocation took as fresh pages at every pass)."""
        if self._part_sums is None or self._part_sums.shape != (self.parts, k, d):
            self._part_sums = torch.empty(self.parts, k, d, dtype=torch.float64)
            self._part_totals = torch.empty(self.parts, k, dtype=torch.float64)
        return self._part_sums, self._part_totals

    def rows_to_score(
        self, centers: torch.Tensor, previous: torch.Tensor, labels: torch.Tensor, every: int = 1
    ) -> float:
        """How many rows a pass testing the bounds would score, now that the centres moved from ``previous`` to
        ``centers``: the pass's own test, on one tile of rows in ``every`` and scaled to all (exact with 1). Nothing
        is written: a read of four numbers a row."""
        new64 = centers.double()
        shift, other, gap = _motion(previous.double(), new64)
        c_max = float((new64**2).sum(1).max())
        count, looked_at = self.loops.rows_to_score(
            *self._test_reads(labels, shift, other, gap), 2 * self.scale * c_max, every
        )
        return count * len(self.x) / max(looked_at, 1)

    def _test_reads(self, labels: torch.Tensor, shift: torch.Tensor, other: torch.Tensor, gap: torch.Tensor) -> tuple:
        """What the bounds' test reads, as the loops take it (``compiled._loosened``'s arguments after the row)."""
        return (
            labels.numpy(),
            self.upper.numpy(),
            self.lower.numpy(),
            self.x_sq.numpy(),
            self.scale,
            shift.numpy(),
            other.numpy(),
            gap.numpy(),
        )

    def run(
        self,
        centers: torch.Tensor,
        previous: torch.Tensor | None,
        labels: torch.Tensor,
        sums: torch.Tensor,
        totals: torch.Tensor,
        test_bounds: bool = False,
    ) -> int:
        """One pass after the centres moved from ``previous`` (None: the first pass, every row scored).

        Relabels the rows that changed cluster, moves their weighted features between the clusters'
        ``sums`` and ``totals`` (float64, in place) and returns how many changed. ``test_bounds``: test them on this
        pass even where the last ones tested skipped too few rows (the caller has counted what they skip now, or
        scores every row faster another way).
        """
        k, d = centers.shape
        new64 = centers.double()
        score_all = previous is None or (self._passes_scoring_all % self.PROBE_EVERY != 0 and not test_bounds)
        zeros = torch.zeros(k, dtype=torch.float64)
        shift, other, gap = (zeros, zeros, zeros) if score_all else _motion(previous.double(), new64)
        c_max = float((new64**2).sum(1).max())
        cm2, c_sq = compiled_scoring.formula(centers)
        part_sums, part_totals = self.part_sums(k, d)
        changed = torch.zeros(self.parts, dtype=torch.int64)
        scored = torch.zeros(self.parts, dtype=torch.int64)
        self.loops.lloyd_pass(
            self.x.numpy(),
            self.weights.numpy(),
            cm2.numpy(),
            c_sq.numpy(),
            *self._test_reads(labels, shift, other, gap),
            self.scale * c_max,
            2 * self.scale * c_max,
            score_all,
            part_sums.numpy(),
            part_totals.numpy(),
            changed.numpy(),
            scored.numpy(),
        )
        sums += part_sums.sum(0)
        totals += part_totals.sum(0)
        n_scored = int(scored.sum())
        self.scored += n_scored
        if previous is not None:
            pays = not score_all and n_scored < (1 - self.MIN_SKIPPED) * len(self.x)
            self._passes_scoring_all = 0 if pays else self._passes_scoring_all + 1
        return int(changed.sum())
