"""The torch engine of :class:`dlscale.kmeans.KMeans`: Lloyd's algorithm, in one process or over ranks.

:func:`lloyd` runs the iterations from given centres on this rank's rows (optionally
weighted) and returns a :class:`LloydFit`; the estimator validates, initialises and keeps
the best of its ``n_init`` runs. It needs torch only (no scikit-learn).

- **Chunks.** Distances are ``‖c‖² − 2·x·cᵀ`` (one GEMM per chunk of rows), so memory is
  chunk × k, never N × k.
- **One collective per iteration.** Each rank keeps its per-cluster weighted sums and
  weights in float64; one all-reduce of ``[sums, weights, labels changed]`` gives every rank
  the same new centres.
- **Rows that cannot change cluster are skipped** (CPUs). Hamerly's bounds (Hamerly 2010,
  "Making k-means even faster") keep, per row, an upper bound on the distance to its centre
  and a lower bound on the distance to any other centre; after the centres move by δ, the
  upper bound grows by its centre's δ and the lower one shrinks by the largest other δ. A
  row is skipped only when its centre is nearer than every other by more than the rounding
  error of the GEMM formula (:func:`_slack`), so the labels are those a full argmin gives:
  exact against scikit-learn, which recomputes every distance. The rest are re-scored, and
  only the rows that changed cluster update the sums.
- **On GPUs** every row is re-scored each iteration and the sums are a one-hot GEMM: free of
  the atomics that make ``index_add_`` differ from run to run there, and a GPU does the
  whole GEMM faster than it could gather the few rows that need it.

The semantics are scikit-learn's Lloyd: stop strictly when no label changed, or when the
squared centre shift is at most ``threshold``; then a last assignment makes the labels
match the returned centres. Empty clusters take the points farthest from their centres.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from .. import distributed
from ..distributed import group_size

#: Bytes the distance block of one chunk may take when ``chunk_size`` is not given. On CPUs a
#: block that stays in the L2 cache is 3-4x faster than a large one (measured in
#: docs/benchmarks.md); on GPUs large blocks keep the device busy.
CPU_CHUNK_BUDGET = 2 * 2**20
GPU_CHUNK_BUDGET = 256 * 2**20


def default_chunk_size(n_clusters: int, itemsize: int, device: torch.device | str = "cpu") -> int:
    """Rows per chunk so that the chunk's distance block (chunk × k) fits the device's budget."""
    if torch.device(device).type == "cpu":
        return int(min(16384, max(256, CPU_CHUNK_BUDGET // (n_clusters * itemsize))))
    return max(1024, GPU_CHUNK_BUDGET // (2 * n_clusters * itemsize))


@dataclass
class LloydFit:
    """One run of Lloyd's algorithm: centres, this rank's labels, the inertia over all ranks, iterations."""

    centers: torch.Tensor
    labels: torch.Tensor
    inertia: float
    n_iter: int
    seconds: float
    #: Distances computed, in rows (each row against every centre), over all passes on this rank:
    #: how much of the work the bounds saved.
    rows_scored: int


def global_mean(x: torch.Tensor, n_total: int, step: int = 2**16) -> torch.Tensor:
    """The mean row over all ranks' rows, summed in float64 (then the same on 1 rank or N, to rounding).

    By cache-sized steps: ``x.sum(0, dtype=torch.float64)`` on a float32 tensor is 6× slower here.
    """
    partial = sum(x[start:start + step].double().sum(0) for start in range(0, x.shape[0], step))
    return distributed.all_reduce_sum(partial if x.shape[0] else x.new_zeros(x.shape[1], dtype=torch.float64)) / n_total


def mean_variance(x: torch.Tensor, n_total: int, chunk: int) -> float:
    """Mean over features of the variance of the whole data set (unweighted, as scikit-learn's ``tol``)."""
    mean = global_mean(x, n_total)
    squares = torch.zeros_like(mean)
    for start in range(0, x.shape[0], chunk):
        squares += ((x[start:start + chunk].double() - mean) ** 2).sum(0)
    return float((distributed.all_reduce_sum(squares) / n_total).mean())


def _argmin_rows(block: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The column of each row's smallest value (the first one on ties, as scikit-learn).

    On CPUs numpy's SIMD argmin is about twice as fast as torch's for rows of a few dozen
    values (docs/benchmarks.md).
    """
    if block.device.type != "cpu":
        return torch.argmin(block, dim=1, out=out) if out is not None else block.argmin(dim=1)
    out = torch.empty(block.shape[0], dtype=torch.int64) if out is None else out
    np.argmin(block.numpy(), axis=1, out=out.numpy())
    return out


def _weighted_inertia(squared: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    squared = squared.clamp(min=0).double()
    return (squared if weights is None else squared * weights).sum()


def assign(x: torch.Tensor, centers: torch.Tensor, chunk: int,
           weights: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
    """Closest centre of every local row, and the local (weighted) inertia, chunk by chunk."""
    c_sq = (centers * centers).sum(1)
    labels = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    inertia = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], chunk):
        xc = x[start:start + chunk]
        block = torch.addmm(c_sq, xc, centers.T, alpha=-2)
        # argmin then gather: torch's min(dim) returning values and indices is several times slower on CPUs
        nearest = labels[start:start + chunk] = _argmin_rows(block)
        best = block.gather(1, nearest[:, None]).squeeze(1) + (xc * xc).sum(1)
        inertia += _weighted_inertia(best, None if weights is None else weights[start:start + chunk])
    return labels, float(inertia)


def inertia_of(x: torch.Tensor, centers: torch.Tensor, labels: torch.Tensor, chunk: int,
               weights: torch.Tensor | None = None) -> float:
    """Sum of (weighted) squared distances of the local rows to the centres of their labels."""
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], chunk):
        xc = x[start:start + chunk]
        squared = ((xc - centers[labels[start:start + chunk]]) ** 2).sum(1)
        total += _weighted_inertia(squared, None if weights is None else weights[start:start + chunk])
    return float(total)


# -- Hamerly's bounds (CPU) -----------------------------------------------------------------------

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


class _Bounds:
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
        k = len(shift)
        if k > 1:
            top = torch.topk(shift, 2)
            other = torch.full_like(shift, float(top.values[0]))
            other[top.indices[0]] = top.values[1]
            gap = torch.cdist(new64, new64).fill_diagonal_(math.inf).amin(1)
        c_max = float((new64 ** 2).sum(1).max())
        maybe = torch.empty(len(labels), dtype=torch.bool, device=labels.device)
        for start in range(0, len(labels), self.STEP):
            rows = slice(start, start + self.STEP)
            mine, upper, lower = labels[rows], self.upper[rows], self.lower[rows]
            upper += shift.index_select(0, mine)
            if k == 1:
                maybe[rows] = False
                continue
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
        return _argmin_rows(block), None, None
    else:
        best = block.amin(1)
        moved = torch.nonzero(block.gather(1, old[:, None]).squeeze(1) > best).squeeze(1)
        nearest = old.clone()
        if len(moved):
            nearest[moved] = _argmin_rows(block.index_select(0, moved))
    if k == 1:
        return nearest, best, torch.full_like(best, math.inf)
    # index_fill_ on the flat block: several times faster than scatter_ on CPUs
    flat = torch.arange(0, rows * k, k, device=xc.device).add_(nearest)
    return nearest, best, block.view(-1).index_fill_(0, flat, math.inf).view(rows, k).amin(1)


#: When more than this share of the rows may change cluster, every row is re-scored in
#: contiguous chunks; below it only those rows are gathered and re-scored.
DENSE_SHARE = 0.5


def _rescore(x: torch.Tensor, maybe: torch.Tensor | None, centers: torch.Tensor, bounds: _Bounds, chunk: int,
             labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Full distances for the rows ``maybe`` marks (all, on the first pass, when None): update labels and bounds
    (the first pass sets no bounds).

    Returns the rows whose label changed, with their old and new labels.
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


# -- one run --------------------------------------------------------------------------------------

class _ClusterSums:
    """This rank's per-cluster weighted sums (k × d) and weights (k), float64, packed for one all-reduce."""

    def __init__(self, k: int, d: int, device: torch.device):
        self.k, self.d = k, d
        self.packed = torch.zeros(k * d + k + 1, dtype=torch.float64, device=device)
        self.sums = self.packed[:k * d].view(k, d)
        self.weights = self.packed[k * d:k * d + k]

    def add(self, rows: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None, sign: float = 1.0,
            chunk: int = 8192) -> None:
        """Add (``sign=-1``: take away) weighted rows to their clusters' sums, by cache-sized chunks.

        In float64 throughout: sums of float32 rows are then exact to far more digits than the
        data has, so one rank and N ranks (whose chunks start elsewhere) find the same centres.
        """
        part = torch.empty(self.k, self.d, dtype=torch.float64, device=rows.device)
        for start in range(0, len(rows), chunk):
            block, into = rows[start:start + chunk].double(), labels[start:start + chunk]
            if weights is not None:  # not in place: .double() of float64 rows is the data itself
                block = block * weights[start:start + chunk, None]
            self.sums.add_(part.zero_().index_add_(0, into, block), alpha=sign)
        self.weights.add_(torch.bincount(labels, weights=weights, minlength=self.k).double(), alpha=sign)

    def all_reduce(self, changed: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        """The sums and weights over all ranks, and the number of labels changed on all ranks."""
        self.packed[-1] = changed
        total = distributed.all_reduce_sum(self.packed.clone())
        k, d = self.k, self.d
        return total[:k * d].view(k, d), total[k * d:k * d + k], float(total[-1])


def _pick(rows: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor | None:
    return None if weights is None else weights.index_select(0, rows)


def lloyd(x: torch.Tensor, weights: torch.Tensor | None, centers: torch.Tensor, max_iter: int, threshold: float,
          chunk: int, skip_rows: bool | None = None) -> LloydFit:
    """Lloyd's iterations from ``centers`` on this rank's rows ``x`` (weights float64, or None for ones).

    ``skip_rows`` chooses the bounds (default on CPUs) or the one-hot pass that re-scores
    every row (default on GPUs); both give the same labels.
    """
    started = time.perf_counter()
    k, d = centers.shape
    on_cpu = x.device.type == "cpu" if skip_rows is None else skip_rows
    labels = torch.full((x.shape[0],), -1, dtype=torch.int64, device=x.device)
    local = _ClusterSums(k, d, x.device)
    bounds = _Bounds(x) if on_cpu else None
    strict = False
    iterations = 0
    for iterations in range(1, max_iter + 1):
        if not on_cpu:
            changed = _one_hot_pass(x, weights, centers, labels, chunk, local)
        elif iterations == 1:
            _rescore(x, None, centers, bounds, chunk, labels)
            local.add(x, labels, weights)
            changed = x.shape[0]
        else:
            rows, sources, targets = _changed_rows(x, centers, previous, labels, bounds, chunk)
            changed_rows = x.index_select(0, rows)
            local.add(changed_rows, targets, _pick(rows, weights))
            local.add(changed_rows, sources, _pick(rows, weights), sign=-1.0)
            changed = len(rows)
        sums, totals, changed_everywhere = local.all_reduce(changed)
        if bool((totals == 0).any()):
            _relocate_empty_clusters(x, weights, centers, labels, sums, totals)
        # A cluster of zero weight keeps its (zero) sum as its centre, as scikit-learn does.
        new_centers = torch.where(totals[:, None] > 0, sums / totals.clamp(min=1e-300)[:, None], sums).to(x.dtype)
        shift = float(((new_centers - centers) ** 2).sum())
        previous, centers = centers, new_centers
        if changed_everywhere == 0:
            strict = True
            break
        if shift <= threshold:
            break
    passes = iterations
    if not strict:  # the last pass's labels belong to the previous centres: assign once more
        passes += 1
        if on_cpu:
            _changed_rows(x, centers, previous, labels, bounds, chunk)
        else:
            labels, _ = assign(x, centers, chunk)
    inertia = inertia_of(x, centers, labels, chunk, weights)
    inertia = float(distributed.all_reduce_sum(torch.tensor([inertia], dtype=torch.float64, device=x.device))[0])
    scored = bounds.scored if on_cpu else passes * x.shape[0]
    return LloydFit(centers, labels, inertia, iterations, time.perf_counter() - started, scored)


def _changed_rows(x: torch.Tensor, centers: torch.Tensor, previous: torch.Tensor, labels: torch.Tensor,
                  bounds: _Bounds, chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """After the centres moved from ``previous``: re-score only the rows the bounds cannot rule out."""
    return _rescore(x, bounds.move(labels, previous, centers), centers, bounds, chunk, labels)


def _one_hot_pass(x: torch.Tensor, weights: torch.Tensor | None, centers: torch.Tensor, labels: torch.Tensor,
                  chunk: int, local: _ClusterSums) -> int:
    """Every row re-scored, sums recomputed with a one-hot GEMM (GPUs: deterministic); returns #changed."""
    local.packed.zero_()
    c_sq = (centers * centers).sum(1)
    changed = torch.zeros((), dtype=torch.int64, device=x.device)
    for start in range(0, x.shape[0], chunk):
        xc = x[start:start + chunk]
        block = torch.addmm(c_sq, xc, centers.T, alpha=-2)
        new = _argmin_rows(block)
        old = labels[start:start + chunk]
        changed += (new != old).sum()
        onehot = block.zero_().scatter_(1, new[:, None], 1.0)
        if weights is not None:
            onehot *= weights[start:start + chunk, None].to(x.dtype)
        local.sums += onehot.T @ xc
        local.weights += onehot.sum(0, dtype=torch.float64)
        old.copy_(new)
    return int(changed)


def _relocate_empty_clusters(x: torch.Tensor, weights: torch.Tensor | None, centers: torch.Tensor,
                             labels: torch.Tensor, sums: torch.Tensor, totals: torch.Tensor) -> None:
    """scikit-learn's repair: each empty cluster takes one of the points farthest from their centres.

    Every rank offers its own farthest points (unweighted distance, as scikit-learn); the
    candidates of all ranks are gathered and sorted (distance, then rank, then row) so every
    rank picks the same ones. The donors lose those points' weighted sums and weights.
    ``sums`` and ``totals`` are changed in place.
    """
    empty = torch.nonzero(totals == 0).flatten()
    n_empty = len(empty)
    far = ((x - centers[labels]) ** 2).sum(1).double()
    take = min(n_empty, x.shape[0])
    values, rows = torch.topk(far, take)
    d = x.shape[1]
    # Each candidate travels as [distance, rank, row, label, weight, features...], padded to n_empty rows.
    rank = dist.get_rank() if group_size() > 1 else 0
    offer = torch.full((n_empty, 5 + d), -math.inf, dtype=torch.float64, device=x.device)
    offer[:take, 0] = values
    offer[:take, 1] = rank
    offer[:take, 2] = rows.double()
    offer[:take, 3] = labels[rows].double()
    offer[:take, 4] = 1.0 if weights is None else weights[rows]
    offer[:take, 5:] = x[rows].double()
    if group_size() > 1:
        gathered = [torch.empty_like(offer) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, offer)
        offer = torch.cat(gathered)
    order = sorted(range(len(offer)), key=lambda i: (-float(offer[i, 0]), float(offer[i, 1]), float(offer[i, 2])))
    for cluster, index in zip(empty.tolist(), order[:n_empty]):
        candidate = offer[index]
        donor, weight = int(candidate[3]), candidate[4]
        sums[donor] -= weight * candidate[5:]
        totals[donor] -= weight
        sums[cluster] = weight * candidate[5:]
        totals[cluster] = weight
