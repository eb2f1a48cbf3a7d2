"""The torch engine of :class:`dlscale.kmeans.KMeans`: Lloyd's algorithm, in one process or over ranks.

:func:`lloyd` runs the iterations from given centres on this rank's rows (optionally
weighted) and returns a :class:`LloydFit`; the estimator validates, initialises and keeps
the best of its ``n_init`` runs. It needs torch (and numba on CPUs, to skip rows), not scikit-learn.

- **Chunks.** Distances are ``‖c‖² − 2·x·cᵀ``, a chunk (GPUs) or a tile (CPUs) of rows at a
  time, so memory is chunk × k, never N × k.
- **One collective per iteration.** Each rank keeps its per-cluster weighted sums and
  weights in float64; one all-reduce of ``[sums, weights, labels changed]`` gives every rank
  the same new centres.
- **Rows that cannot change cluster are skipped** (CPUs): Hamerly's bounds, in one compiled
  pass that also scores the rest and moves the rows that changed cluster between the sums
  (:mod:`~dlscale.kmeans.hamerly`). A row is skipped only when its centre is nearer than
  every other by more than the rounding error of the distance formula, so the labels are
  those a full argmin gives: exact against scikit-learn, which recomputes every distance.
  At many features a GEMM may score every row faster than the loop scores the few left
  (:mod:`~dlscale.kmeans.blas_pass`): each fit times both and runs the faster
  (:mod:`~dlscale.kmeans.cpu_pass`); the two give the same labels and sums, bit for bit.
- **On GPUs** every row is re-scored each iteration and the sums are a one-hot GEMM: free of
  the atomics that make ``index_add_`` differ from run to run there, and a GPU does the
  whole GEMM faster than it could gather the few rows that need it.
- **Sums in float64.** Sums of float32 rows are then exact to far more digits than the data
  has, so one rank and N ranks find the same centres.

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

from dlscale import distributed
from dlscale.errors import import_optional
from dlscale.kmeans import compiled_scoring
from dlscale.kmeans.cpu_pass import CpuPass
from dlscale.kmeans.errors import KMeansError
from dlscale.kmeans.scoring import argmin_rows, assign, inertia_of, squared_distances

#: Bytes the blocks of one chunk may take when ``chunk_size`` is not given. On CPUs a
#: block that stays in the L2 cache is 3-4x faster than a large one (measured in
#: docs/benchmarks.md); on GPUs large blocks keep the device busy.
CPU_CHUNK_BUDGET = 2 * 2**20
GPU_CHUNK_BUDGET = 256 * 2**20


def default_chunk_size(n_clusters: int, itemsize: int, device: torch.device | str = "cpu", n_features: int = 0) -> int:
    """Rows per chunk so that the chunk's blocks fit the device's budget: its distance block (chunk × k) on a CPU;
    on a GPU also its float64 one-hot block (chunk × k) and its float64 copy for the sums (chunk × d)."""
    if torch.device(device).type == "cpu":
        return int(min(16384, max(256, CPU_CHUNK_BUDGET // (n_clusters * itemsize))))
    return max(1024, GPU_CHUNK_BUDGET // (n_clusters * (itemsize + 8) + n_features * 8))


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
    #: The pass that ran (most of the passes, on CPUs, where it is chosen per pass): ``"compiled"`` (Hamerly's bounds,
    #: the scoring and the sums in one numba loop), ``"blas"`` (every row scored by a GEMM, the labels and sums
    #: those of the compiled pass) or ``"gemm"`` (every row scored by a GEMM per chunk, the sums by a one-hot GEMM:
    #: GPUs, or CPUs without numba).
    pass_name: str = "compiled"


def global_mean(x: torch.Tensor, n_total: int, chunk: int) -> torch.Tensor:
    """The mean row over all ranks' rows, summed in float64 (then the same on 1 rank or N, to rounding).

    On CPUs with numba by a compiled loop (10× faster than torch here: it copies no rows to float64); otherwise
    chunk by chunk, each chunk's rows copied to float64 (``x.sum(0, dtype=torch.float64)`` on a float32 tensor is
    6× slower), within the chunk's memory budget.
    """
    if x.device.type == "cpu" and compiled_scoring.available():
        total = compiled_scoring.column_sums(x)
    else:
        total = x.new_zeros(x.shape[1], dtype=torch.float64)
        for start in range(0, x.shape[0], chunk):
            total += x[start : start + chunk].double().sum(0)
    return distributed.all_reduce_sum(total) / n_total


def centred(x: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """``x − mean``, a new tensor: on CPUs in a buffer numpy allocates, bit for bit torch's subtraction.

    numpy asks the kernel for huge pages for a large array (``madvise``), torch's allocator does not: writing the
    centred copy of 120,000 × 128 float32 rows (61 MB) took 6 ms in numpy's buffer against 26 ms in torch's here,
    each 4 KB page a fault (docs/benchmarks.md, "The fused BLAS pass")."""
    if x.device.type != "cpu":
        return x - mean
    rows = x.numpy()
    out = np.empty(rows.shape, dtype=rows.dtype)
    np.subtract(rows, mean.numpy(), out=out)
    return torch.from_numpy(out)


def mean_variance(x: torch.Tensor, mean: torch.Tensor, n_total: int, chunk: int) -> float:
    """Mean over features of the variance of the whole data set about its ``mean`` (float64, unweighted, as
    scikit-learn's ``tol``)."""
    squares = torch.zeros_like(mean)
    for start in range(0, x.shape[0], chunk):
        squares += ((x[start : start + chunk].double() - mean) ** 2).sum(0)
    return float((distributed.all_reduce_sum(squares) / n_total).mean())


# -- one run --------------------------------------------------------------------------------------


class _ClusterSums:
    """This rank's per-cluster weighted sums (k × d) and weights (k), float64, packed for one all-reduce."""

    def __init__(self, k: int, d: int, device: torch.device):
        self.k, self.d = k, d
        self.packed = torch.zeros(k * d + k + 1, dtype=torch.float64, device=device)
        self.sums = self.packed[: k * d].view(k, d)
        self.weights = self.packed[k * d : k * d + k]

    def all_reduce(self, changed: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        """The sums and weights over all ranks, and the number of labels changed on all ranks."""
        self.packed[-1] = changed
        total = distributed.all_reduce_sum(self.packed.clone())
        k, d = self.k, self.d
        return total[: k * d].view(k, d), total[k * d : k * d + k], float(total[-1])


def lloyd(
    x: torch.Tensor,
    weights: torch.Tensor | None,
    centers: torch.Tensor,
    max_iter: int,
    threshold: float,
    chunk: int,
    skip_rows: bool | None = None,
    verbose: bool = False,
    cpu_pass: str = "auto",
) -> LloydFit:
    """Lloyd's iterations from ``centers`` on this rank's rows ``x`` (weights float64, or None for ones).

    ``skip_rows`` chooses Hamerly's bounds in one compiled pass (default on CPUs where numba,
    of the ``kmeans`` extra, is installed) or the one-hot pass that re-scores every row
    (default on GPUs); both give the same labels. With the bounds, ``cpu_pass`` chooses how the rows the bounds
    leave are scored: "auto" (from counted work and a probed ratio: :mod:`~dlscale.kmeans.cpu_pass`), "compiled" or
    "blas"; the results are bit for bit the same. ``verbose`` prints each iteration's inertia and why it stopped, as
    scikit-learn's ``verbose=1`` does (on the first rank; the inertia costs one more scoring pass per iteration).
    """
    started = time.perf_counter()
    k, d = centers.shape
    use_bounds = _use_bounds(x.device, skip_rows)
    labels = torch.full((x.shape[0],), -1, dtype=torch.int64, device=x.device)
    local = _ClusterSums(k, d, x.device)
    bounds = CpuPass(x, weights, cpu_pass) if use_bounds else None
    strict = False
    iterations = 0
    previous = None
    for iterations in range(1, max_iter + 1):
        if use_bounds:
            changed = bounds.run(centers, previous, labels, local.sums, local.weights)
        else:
            changed = _one_hot_pass(x, weights, centers, labels, chunk, local)
        if verbose:
            inertia = _total(inertia_of(x, centers, labels, chunk, weights), x)
            say_on_first_rank(f"Iteration {iterations - 1}, inertia {inertia}")
        sums, totals, changed_everywhere = local.all_reduce(changed)
        if bool((totals == 0).any()):
            _relocate_empty_clusters(x, weights, centers, labels, sums, totals, chunk)
        # A cluster still empty (more clusters than distinct points) goes where the heaviest one is, as scikit-learn's
        # does: it stays empty, and the fit can converge.
        means = sums / totals.clamp(min=1e-300)[:, None]
        new_centers = torch.where(totals[:, None] > 0, means, means[torch.argmax(totals)]).to(x.dtype)
        shift = float(((new_centers - centers) ** 2).sum())
        previous, centers = centers, new_centers
        if changed_everywhere == 0:
            strict = True
            if verbose:
                say_on_first_rank(f"Converged at iteration {iterations - 1}: strict convergence.")
            break
        if shift <= threshold:
            if verbose:
                say_on_first_rank(
                    f"Converged at iteration {iterations - 1}: center shift {shift} within tolerance {threshold}."
                )
            break
    passes = iterations
    if strict or use_bounds:
        if not strict:  # the last pass's labels belong to the previous centres: assign once more
            passes += 1
            bounds.run(centers, previous, labels, torch.zeros_like(local.sums), torch.zeros_like(local.weights))
        inertia = inertia_of(x, centers, labels, chunk, weights)
    else:  # on GPUs a full assignment gives the labels and the inertia in one pass
        passes += 1
        labels, inertia = assign(x, centers, chunk, weights, compiled=False)
    inertia = _total(inertia, x)
    scored = bounds.scored if use_bounds else passes * x.shape[0]
    return LloydFit(
        centers,
        labels,
        inertia,
        iterations,
        time.perf_counter() - started,
        scored,
        bounds.name if use_bounds else "gemm",
    )


def _total(inertia: float, x: torch.Tensor) -> float:
    """This rank's inertia summed over the ranks (a collective)."""
    return float(distributed.all_reduce_sum(torch.tensor([inertia], dtype=torch.float64, device=x.device))[0])


def say_on_first_rank(line: str) -> None:
    """Print a line of ``verbose`` output once for the job."""
    if distributed.rank() == 0:
        print(line, flush=True)


def _use_bounds(device: torch.device, skip_rows: bool | None) -> bool:
    """Whether to skip rows by Hamerly's bounds: on CPUs with numba, unless told."""
    if skip_rows is None:
        return device.type == "cpu" and compiled_scoring.available()
    if skip_rows:
        if device.type != "cpu":
            raise KMeansError(f"skipping rows by bounds runs on CPUs; on {device} every row is re-scored")
        import_optional("numba", "kmeans", "K-Means skipping rows by Hamerly's bounds", KMeansError)
    return skip_rows


def _one_hot_pass(
    x: torch.Tensor,
    weights: torch.Tensor | None,
    centers: torch.Tensor,
    labels: torch.Tensor,
    chunk: int,
    local: _ClusterSums,
) -> int:
    """Every row re-scored, sums recomputed with a one-hot GEMM (GPUs: deterministic); returns #changed.

    The GEMM runs in float64 (the one-hot rows, the weights and the chunk's rows): accumulated in
    float32 over half a million rows a chunk, the sums would lose the digits that make one rank
    and N ranks find the same centres.
    """
    local.packed.zero_()
    c_sq = (centers * centers).sum(1)
    changed = torch.zeros((), dtype=torch.int64, device=x.device)
    onehot_buffer = torch.empty(min(chunk, x.shape[0]), centers.shape[0], dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], chunk):
        xc = x[start : start + chunk]
        block = torch.addmm(c_sq, xc, centers.T, alpha=-2)
        new = argmin_rows(block)
        del block  # (before the float64 block: at most one chunk-sized block of each at a time)
        old = labels[start : start + chunk]
        changed += (new != old).sum()
        onehot = onehot_buffer[: len(xc)].zero_().scatter_(1, new[:, None], 1.0)
        if weights is not None:
            onehot *= weights[start : start + chunk, None]
        local.sums += onehot.T @ xc.double()
        local.weights += onehot.sum(0)
        old.copy_(new)
    return int(changed)


def _farthest_distinct_rows(x: torch.Tensor, order: torch.Tensor, count: int) -> torch.Tensor:
    """The rows of the ``count`` farthest distinct points (the first copy of each), ``order`` being the rows by
    distance, farthest first.

    Only the farthest rows are compared, as many as it takes (1,024 or 8 per empty cluster, doubled while copies
    fill them): a fit with an empty cluster on a million rows does not sort all of them by their features.
    """
    pool = min(len(order), max(1024, 8 * count))
    while True:
        candidates = order[:pool]
        _, group = torch.unique(x[candidates], dim=0, return_inverse=True)
        first = torch.full((int(group.max()) + 1,), pool, dtype=torch.int64, device=x.device)
        first.scatter_reduce_(0, group, torch.arange(pool, device=x.device), "amin")
        if len(first) >= count or pool == len(order):
            return candidates[torch.sort(first).values[:count]]
        pool = min(len(order), 2 * pool)


def _relocate_empty_clusters(
    x: torch.Tensor,
    weights: torch.Tensor | None,
    centers: torch.Tensor,
    labels: torch.Tensor,
    sums: torch.Tensor,
    totals: torch.Tensor,
    chunk: int,
) -> None:
    """scikit-learn's repair: each empty cluster takes one of the points farthest from their centres.

    Each takes a different point: copies of one row (a photo's many pixels of one colour) are offered once, and a
    point another rank offered too is taken once, so that when k is at least the number of distinct points every
    one of them becomes a centre. Only when the distinct points run out do empty clusters take copies, and never
    a point at distance 0 (it is a centre already). Every rank
    offers its own farthest points (unweighted distance, as scikit-learn); the candidates of all ranks are gathered
    and sorted (distance, then rank, then row) so every rank picks the same ones. The donors lose those points'
    weighted sums and weights. ``sums`` and ``totals`` are changed in place.
    """
    empty = torch.nonzero(totals == 0).flatten()
    n_empty = len(empty)
    far = squared_distances(x, centers, labels, chunk)
    order = torch.argsort(far, descending=True, stable=True)  # (distance, then row)
    distinct = _farthest_distinct_rows(x, order, n_empty)
    take = min(n_empty, x.shape[0])
    copies = order[:take]  # (for when there are fewer distinct points than empty clusters)
    rows = torch.cat([distinct, copies[~torch.isin(copies, distinct)]])[:take]
    d = x.shape[1]
    # Each candidate travels as [distance, rank, row, label, weight, features...], padded to n_empty rows.
    rank = distributed.rank()
    offer = torch.full((n_empty, 5 + d), -math.inf, dtype=torch.float64, device=x.device)
    offer[:take, 0] = far[rows]
    offer[:take, 1] = rank
    offer[:take, 2] = rows.double()
    offer[:take, 3] = labels[rows].double()
    offer[:take, 4] = 1.0 if weights is None else weights[rows]
    offer[:take, 5:] = x[rows].double()
    offer = torch.cat(distributed.all_gather(offer))
    order = sorted(range(len(offer)), key=lambda i: (-float(offer[i, 0]), float(offer[i, 1]), float(offer[i, 2])))
    # (a point at distance 0 already is a centre: moving it only moves the emptiness, as when there are more
    # clusters than distinct points, where scikit-learn stops relocating too)
    offered = [i for i in order if offer[i, 0] > 0]
    taken: list[int] = []
    for index in offered:  # distinct points first, in order...
        if len(taken) < n_empty and not any(torch.equal(offer[index, 5:], offer[j, 5:]) for j in taken):
            taken.append(index)
    taken += [i for i in offered if i not in taken][: n_empty - len(taken)]  # ...then copies, if points run out
    for cluster, index in zip(empty.tolist(), taken):
        candidate = offer[index]
        donor, weight = int(candidate[3]), candidate[4]
        sums[donor] -= weight * candidate[5:]
        totals[donor] -= weight
        sums[cluster] = weight * candidate[5:]
        totals[cluster] = weight
