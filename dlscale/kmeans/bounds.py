"""Hamerly's bounds: which rows may have a new nearest centre after the centres moved (CPUs).

Per row, ``upper`` ≥ the distance to its centre and ``lower`` ≤ the distance to any other
(Hamerly 2010, "Making k-means even faster"). When the centres move by δ, the upper bound
grows by its centre's δ and the lower one shrinks by the largest other δ; the triangle
inequality also gives ``gap − upper`` (``gap``: from the row's centre to its nearest other
centre) as a lower bound. A row is re-scored only when the bounds leave less than twice the
rounding error of the GEMM formula (:func:`_slack_scale`) between its centre and the others,
so every skipped row is one a full argmin would leave where it is.
"""

from __future__ import annotations

import math

import torch

from dlscale.kmeans.scoring import argmin_rows


def _slack_scale(centers: torch.Tensor) -> float:
    """The rounding error of a squared distance ``‖x‖² − 2·x·c + ‖c‖²`` is at most this × (‖x‖² + ‖c‖²).

    Each term is a sum of d + 2 products in the data's precision: the error is at most about
    (d + 2)·ε·(‖x‖² + ‖c‖²) (Higham's γ bound, doubled for the cross term); 4× that is kept.
    A row is skipped only when its centre wins by twice this, so no rounding can reverse it.
    """
    return 4 * (centers.shape[1] + 2) * torch.finfo(centers.dtype).eps


def _take(values: torch.Tensor, rows: torch.Tensor | slice) -> torch.Tensor:
    """``values[rows]``: a view for a slice, ``index_select`` for indices (several times faster on CPUs)."""
    return values[rows] if isinstance(rows, slice) else values.index_select(0, rows)


class Bounds:
    """Per-row distance bounds: ``upper`` ≥ distance to its centre, ``lower`` ≤ distance to any other."""

    #: Rows per step when the bounds move: the temporaries of a step stay in the cache.
    STEP = 2**16

    def __init__(self, x: torch.Tensor):
        # ‖x‖² only scales the rounding slack, so the data's precision is enough; by steps, to stay in the cache.
        x_sq = torch.cat([(x[s:s + self.STEP] ** 2).sum(1) for s in range(0, len(x), self.STEP)]).double()
        self.scale = _slack_scale(x)
        # ‖x‖² with its share of the slack added (upper bounds) or taken (lower bounds), and twice the slack
        self.above, self.below, self.margin = x_sq * (1 + self.scale), x_sq * (1 - self.scale), x_sq * 2 * self.scale
        # Before the first bounds are set, no row can be skipped.
        self.upper = torch.full_like(x_sq, math.inf)
        self.lower = torch.zeros_like(x_sq)
        self.scored = 0

    def set(self, rows: torch.Tensor | slice, best: torch.Tensor, second: torch.Tensor,
            centers: torch.Tensor) -> None:
        """Bounds from ``‖c‖² − 2·x·c`` just computed for the nearest and second nearest centre.

        With ``‖x‖²`` added these are squared distances, each within the slack of the exact one.
        """
        c_slack = self.scale * float((centers.double() ** 2).sum(1).max())
        upper = best.double().add_(_take(self.above, rows)).add_(c_slack).clamp_(min=0).sqrt_()
        lower = second.double().add_(_take(self.below, rows)).sub_(c_slack).clamp_(min=0).sqrt_()
        if isinstance(rows, slice):
            self.upper[rows], self.lower[rows] = upper, lower
        else:
            self.upper.index_copy_(0, rows, upper)
            self.lower.index_copy_(0, rows, lower)

    def move(self, labels: torch.Tensor, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """Loosen the bounds by how far the centres moved; return a mask of the rows that may change cluster.

        A row's centre moved by ``shift[c]``, any other by at most ``other[c]`` (the largest
        shift of the other centres). Any other centre is also at least ``gap[c] − upper`` away,
        ``gap[c]`` being the distance from ``c`` to its nearest other centre (triangle inequality).
        """
        new64 = new.double()
        shift = ((new64 - old.double()) ** 2).sum(1).sqrt_().mul_(1 + 1e-9)
        maybe = torch.zeros(len(labels), dtype=torch.bool, device=labels.device)
        if len(shift) == 1:  # one cluster: no row can change
            return maybe
        top = torch.topk(shift, 2)
        other = torch.full_like(shift, float(top.values[0]))
        other[top.indices[0]] = top.values[1]
        gap = torch.cdist(new64, new64).fill_diagonal_(math.inf).amin(1)
        c_max = float((new64 ** 2).sum(1).max())
        for start in range(0, len(labels), self.STEP):
            rows = slice(start, start + self.STEP)
            mine, upper, lower = labels[rows], self.upper[rows], self.lower[rows]
            upper += shift.index_select(0, mine)
            lower -= other.index_select(0, mine)
            floor = gap.index_select(0, mine).sub_(upper)
            torch.maximum(floor, lower, out=floor).clamp_(min=0).square_()
            slack = self.margin[rows].add(2 * self.scale * c_max)
            torch.ge(slack.addcmul_(upper, upper), floor, out=maybe[rows])
        return maybe


def _nearest_two(xc: torch.Tensor, old: torch.Tensor | None, centers: torch.Tensor, c_sq: torch.Tensor,
                 out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Nearest centre of each row, and ``‖c‖² − 2·x·c`` (the squared distance less ``‖x‖²``) for the
    nearest and the second nearest centre.

    Most rows keep their cluster (``old``; None on the first pass): a row whose centre still
    attains the row's minimum stays, found with a fast amin and gather, and only the others
    need an argmin. (Only an exact tie with a lower-numbered centre could make argmin choose
    otherwise.) The second nearest is the minimum once the nearest is masked.
    """
    rows, k = len(xc), centers.shape[0]
    block = torch.addmm(c_sq, xc, centers.T, alpha=-2, out=out[:rows])
    if old is None:  # the first pass: the centres will move too far for its bounds to skip anything
        return argmin_rows(block), None, None
    best = block.amin(1)
    moved = torch.nonzero(block.gather(1, old[:, None]).squeeze(1) > best).squeeze(1)
    nearest = old.clone()
    if len(moved):
        nearest[moved] = argmin_rows(block.index_select(0, moved))
    if k == 1:
        return nearest, best, torch.full_like(best, math.inf)
    # index_fill_ on the flat block: several times faster than scatter_ on CPUs
    flat = torch.arange(0, rows * k, k, device=xc.device).add_(nearest)
    return nearest, best, block.view(-1).index_fill_(0, flat, math.inf).view(rows, k).amin(1)


#: When more than this share of the rows may change cluster, every row is re-scored in
#: contiguous chunks; below it only those rows are gathered and re-scored.
DENSE_SHARE = 0.5


def rescore(x: torch.Tensor, maybe: torch.Tensor | None, centers: torch.Tensor, bounds: Bounds, chunk: int,
             labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Full distances for the rows ``maybe`` marks (all, on the first pass, when None): update labels and bounds
    (the first pass sets no bounds).

    Returns the rows whose label changed, with their old and new labels (none on the first pass,
    where every row gets its first label).
    """
    n = x.shape[0]
    if maybe is None or int(maybe.sum()) > DENSE_SHARE * n:
        blocks = [slice(start, start + chunk) for start in range(0, n, chunk)]
    else:
        marked = torch.nonzero(maybe).squeeze(1)
        blocks = [marked[start:start + chunk] for start in range(0, len(marked), chunk)]
    c_sq = (centers * centers).sum(1)
    out = torch.empty(min(chunk, n), centers.shape[0], dtype=x.dtype, device=x.device)
    moved, sources, targets = [], [], []
    for rows in blocks:
        old = None if maybe is None else _take(labels, rows)
        nearest, best, second = _nearest_two(_take(x, rows), old, centers, c_sq, out)
        bounds.scored += len(nearest)
        if old is None:
            labels[rows] = nearest
            continue
        bounds.set(rows, best, second, centers)
        change = torch.nonzero(nearest != old).squeeze(1)
        if len(change):
            where = change + rows.start if isinstance(rows, slice) else rows.index_select(0, change)
            moved.append(where)
            sources.append(old.index_select(0, change))
            targets.append(nearest.index_select(0, change))
            labels.index_copy_(0, where, targets[-1])
    if not moved:
        empty = torch.empty(0, dtype=torch.int64, device=x.device)
        return empty, empty, empty
    return torch.cat(moved), torch.cat(sources), torch.cat(targets)


def changed_rows(x: torch.Tensor, centers: torch.Tensor, previous: torch.Tensor, labels: torch.Tensor,
                  bounds: Bounds, chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """After the centres moved from ``previous``: re-score only the rows the bounds cannot rule out."""
    return rescore(x, bounds.move(labels, previous, centers), centers, bounds, chunk, labels)
