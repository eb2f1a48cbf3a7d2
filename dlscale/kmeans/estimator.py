"""Distributed K-Means with scikit-learn's interface and semantics.

``KMeans(...).fit(X)`` runs Lloyd's algorithm. When ``torch.distributed`` is initialised
(under ``torchrun``, ``srun`` or ``mpirun``), each rank passes **its own shard** of the data
and every rank ends with the same centres; otherwise it runs in one process. Two engines:

- ``backend="torch"``: chunked distances ``‖c‖² − 2·x·cᵀ`` (one GEMM per chunk, so memory
  is chunk × k, never N × k), per-cluster sums and counts in float64 that, after the first
  iteration, only the rows that changed cluster update (on GPUs: a one-hot GEMM, free of
  the atomics that make ``index_add_`` differ from run to run there), and one all-reduce of
  ``[sums, counts, labels changed]`` per iteration. CPU (gloo) or CUDA (NCCL).
- ``backend="daal4py"``: Intel oneDAL's SPMD K-Means under ``mpirun``
  (:mod:`dlscale.kmeans.daal`), from ``scikit-learn-intelex``.

``backend="auto"`` uses daal4py when the ranks were started by ``mpirun``/``srun`` without a
torch process group (oneDAL's SPMD mode joins them), and torch everywhere else: on GPUs, in
a process group, and in one process on CPUs, where it measured faster than daal4py
(docs/benchmarks.md). The semantics follow scikit-learn's Lloyd: ``tol`` is
relative to the mean per-feature variance of the whole data set; iteration stops when the
squared centre shift is at most that, or strictly when no label changed; a final assignment
makes ``labels_`` match ``cluster_centers_``; empty clusters take the points farthest from
their centres. Lesson 08 teaches it; ``dlscale kmeans`` and ``dlscale bench kmeans`` run it.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .. import distributed
from ..devices import resolve_device
from ..distributed import group_size
from . import daal
from .errors import KMeansError
from .initialization import kmeans_parallel, kmeans_plusplus, random_init

#: Bytes the distance block of one chunk may take when ``chunk_size`` is not given. On CPUs a
#: block that stays in the L2 cache is 3-4x faster than a large one (measured in
#: docs/benchmarks.md); on GPUs large blocks keep the device busy.
CPU_CHUNK_BUDGET = 2 * 2**20
GPU_CHUNK_BUDGET = 256 * 2**20


def _as_tensor(X: Any, device: torch.device) -> torch.Tensor:
    if isinstance(X, torch.Tensor):
        x = X.detach()
    else:
        array = np.asarray(X)
        if array.dtype not in (np.float32, np.float64):
            array = array.astype(np.float64)
        x = torch.from_numpy(np.ascontiguousarray(array))
    if x.ndim != 2:
        raise KMeansError(f"K-Means needs a 2-D array (samples × features), got shape {tuple(x.shape)}")
    if not x.is_floating_point() or x.dtype not in (torch.float32, torch.float64):
        x = x.double()
    return x.to(device).contiguous()


def resolve_backend(backend: str, device: torch.device) -> str:
    """``torch`` or ``daal4py`` for ``auto`` (see the module docstring)."""
    if backend not in ("auto", "torch", "daal4py"):
        raise KMeansError(f"backend must be auto, torch or daal4py; got {backend!r}")
    if backend != "auto":
        return backend
    if device.type != "cpu" or group_size() > 1:
        return "torch"
    return "daal4py" if daal.spmd_ranks() > 1 and daal.available() else "torch"


def default_chunk_size(n_clusters: int, itemsize: int, device: torch.device | str = "cpu") -> int:
    """Rows per chunk so that the chunk's distance block (chunk × k) fits the device's budget."""
    if torch.device(device).type == "cpu":
        return int(min(16384, max(256, CPU_CHUNK_BUDGET // (n_clusters * itemsize))))
    return max(1024, GPU_CHUNK_BUDGET // (2 * n_clusters * itemsize))


class KMeans:
    """K-Means clustering, in one process or data-parallel over the ranks of a job.

    Parameters follow :class:`sklearn.cluster.KMeans`. ``init`` is ``"k-means++"`` (in a job
    of several ranks it runs as its distributed form, k-means||), ``"k-means||"``,
    ``"random"``, or an array of initial centres. ``device=None`` picks CUDA when present.
    ``chunk_size`` rows are scored at a time (default: a cache-sized block on CPUs, 256 MiB on GPUs).

    Fitted attributes: ``cluster_centers_`` (identical on every rank), ``labels_`` (of this
    rank's samples), ``inertia_`` (over all ranks), ``n_iter_``, and ``timings_`` (seconds:
    ``init``, ``iterations``, ``per_iteration``, ``total``).
    """

    def __init__(self, n_clusters: int = 8, *, init: str | np.ndarray = "k-means++", n_init: int = 1,
                 max_iter: int = 300, tol: float = 1e-4, backend: str = "auto", device: str | None = None,
                 chunk_size: int | None = None, random_state: int | None = None, n_local_trials: int | None = None,
                 oversampling: float | None = None, rounds: int = 5):
        self.n_clusters, self.init, self.n_init, self.max_iter, self.tol = n_clusters, init, n_init, max_iter, tol
        self.backend, self.device, self.chunk_size, self.random_state = backend, device, chunk_size, random_state
        self.n_local_trials, self.oversampling, self.rounds = n_local_trials, oversampling, rounds

    # -- scikit-learn interface ---------------------------------------------------------------

    def fit(self, X: Any, y: Any = None) -> KMeans:
        """Cluster ``X`` (this rank's shard when a process group exists)."""
        self._validate()
        device = self._device()
        backend = resolve_backend(self.backend, device)
        self.backend_ = backend
        if backend == "daal4py":
            found = daal.fit_daal4py(np.asarray(X.cpu() if isinstance(X, torch.Tensor) else X), self.n_clusters,
                                     self.init, self.max_iter, self.tol, self.random_state)
            self.cluster_centers_, self.labels_, self.inertia_ = found.cluster_centers, found.labels, found.inertia
            self.n_iter_, self.timings_ = found.n_iter, found.timings
            self.n_features_in_ = found.cluster_centers.shape[1]
            return self
        x = _as_tensor(X, device)
        if x.shape[0] == 0:
            raise KMeansError("this rank's shard is empty: give every rank at least one sample")
        best = None
        for attempt in range(self.n_init):
            result = self._fit_once(x, attempt)
            if best is None or result["inertia"] < best["inertia"]:
                best = result
        self.cluster_centers_ = best["centers"].cpu().numpy()
        self.labels_ = best["labels"].cpu().numpy()
        self.inertia_, self.n_iter_, self.timings_ = best["inertia"], best["n_iter"], best["timings"]
        self.n_features_in_ = x.shape[1]
        return self

    def predict(self, X: Any) -> np.ndarray:
        """The closest centre of each row of ``X`` (local: no communication)."""
        centers = self._fitted_centers()
        x = _as_tensor(X, centers.device).to(centers.dtype)
        labels, _ = _assign(x, centers, self._chunk(x))
        return labels.cpu().numpy()

    def fit_predict(self, X: Any, y: Any = None) -> np.ndarray:
        return self.fit(X).labels_

    def transform(self, X: Any) -> np.ndarray:
        """Euclidean distances from each row of ``X`` to every centre (n × k: use on modest ``X``)."""
        centers = self._fitted_centers()
        x = _as_tensor(X, centers.device).to(centers.dtype)
        return torch.cdist(x, centers).cpu().numpy()

    def score(self, X: Any, y: Any = None) -> float:
        """Minus the inertia of ``X`` against the fitted centres (scikit-learn's convention; local)."""
        centers = self._fitted_centers()
        x = _as_tensor(X, centers.device).to(centers.dtype)
        _, inertia = _assign(x, centers, self._chunk(x))
        return -inertia

    def __repr__(self) -> str:
        return (f"KMeans(n_clusters={self.n_clusters}, init={self.init if isinstance(self.init, str) else 'array'}, "
                f"backend={self.backend})")

    # -- internals ----------------------------------------------------------------------------

    def _validate(self) -> None:
        if not isinstance(self.n_clusters, int) or self.n_clusters < 1:
            raise KMeansError(f"n_clusters must be a positive integer, got {self.n_clusters!r}")
        if self.max_iter < 1 or self.n_init < 1 or self.tol < 0:
            raise KMeansError("max_iter and n_init must be >= 1 and tol >= 0")
        if isinstance(self.init, str) and self.init not in ("k-means++", "k-means||", "random"):
            raise KMeansError(f"init must be 'k-means++', 'k-means||', 'random' or an array; got {self.init!r}")

    def _device(self) -> torch.device:
        return resolve_device(self.device, KMeansError)

    def _chunk(self, x: torch.Tensor) -> int:
        return self.chunk_size or default_chunk_size(self.n_clusters, x.element_size(), x.device)

    def _fitted_centers(self) -> torch.Tensor:
        if not hasattr(self, "cluster_centers_"):
            raise KMeansError("this KMeans is not fitted yet: call fit(X) first")
        return torch.from_numpy(self.cluster_centers_).to(self._device())

    def _initial_centers(self, x: torch.Tensor, attempt: int, n_total: int) -> torch.Tensor:
        k = self.n_clusters
        if not isinstance(self.init, str):
            centers = _as_tensor(self.init, x.device).to(x.dtype)
            if tuple(centers.shape) != (k, x.shape[1]):
                raise KMeansError(f"init has shape {tuple(centers.shape)}, expected ({k}, {x.shape[1]})")
            return centers.clone()
        if n_total < k:
            raise KMeansError(f"n_clusters={k} is more than the {n_total} samples")
        seed = (self.random_state if self.random_state is not None else np.random.randint(2**31 - 1)) + attempt
        seed = distributed.broadcast_object(seed) if group_size() > 1 else seed
        generator = torch.Generator().manual_seed(int(seed))
        if self.init == "random":
            return random_init(x, k, generator)
        if self.init == "k-means||" or group_size() > 1:
            return kmeans_parallel(x, k, generator, self._chunk(x), oversampling=self.oversampling,
                                   rounds=self.rounds)
        return kmeans_plusplus(x, k, generator, self.n_local_trials)

    def _fit_once(self, x: torch.Tensor, attempt: int) -> dict:
        started = time.perf_counter()
        k, chunk = self.n_clusters, self._chunk(x)
        rows = torch.tensor([float(x.shape[0])], dtype=torch.float64, device=x.device)
        n_total = int(distributed.all_reduce_sum(rows)[0])
        threshold = self.tol * _mean_variance(x, n_total, chunk) if self.tol > 0 else 0.0
        centers = self._initial_centers(x, attempt, n_total)
        init_done = time.perf_counter()
        labels = torch.full((x.shape[0],), -1, dtype=torch.int64, device=x.device)
        # This rank's per-cluster sums and counts, kept from one iteration to the next (float64).
        local = torch.zeros(k * x.shape[1] + k + 1, dtype=torch.float64, device=x.device)
        strict = False
        iterations = 0
        for iterations in range(1, self.max_iter + 1):
            changed = _lloyd_pass(x, centers, labels, chunk, local, first=iterations == 1)
            local[-1] = changed
            # One collective per iteration: sums, counts and the number of changed labels together.
            packed = distributed.all_reduce_sum(local.clone())
            sums, counts = packed[:k * x.shape[1]].view(k, -1), packed[k * x.shape[1]:-1]
            if bool((counts == 0).any()):
                _relocate_empty_clusters(x, centers, labels, sums, counts)
            new_centers = (sums / counts[:, None]).to(x.dtype)
            shift = float(((new_centers - centers) ** 2).sum())
            centers = new_centers
            if packed[-1] == 0:
                strict = True
                break
            if shift <= threshold:
                break
        loop_done = time.perf_counter()
        if strict:  # the labels already belong to these centres; only the inertia is needed
            inertia = _inertia(x, centers, labels, chunk)
        else:  # the last pass's labels belong to the previous centres: assign once more
            labels, inertia = _assign(x, centers, chunk)
        inertia = float(distributed.all_reduce_sum(torch.tensor([inertia], dtype=torch.float64, device=x.device))[0])
        total = time.perf_counter() - started
        return {"centers": centers, "labels": labels, "inertia": inertia, "n_iter": iterations,
                "timings": {"init": init_done - started, "iterations": loop_done - init_done,
                            "per_iteration": (loop_done - init_done) / max(iterations, 1), "total": total}}


# -- the pieces of one Lloyd iteration ------------------------------------------------------------

def _mean_variance(x: torch.Tensor, n_total: int, chunk: int) -> float:
    """Mean over features of the variance of the whole data set (two passes: mean, then squared deviations)."""
    mean = distributed.all_reduce_sum(x.sum(0, dtype=torch.float64)) / n_total
    squares = torch.zeros_like(mean)
    for start in range(0, x.shape[0], chunk):
        squares += ((x[start:start + chunk].double() - mean) ** 2).sum(0)
    return float((distributed.all_reduce_sum(squares) / n_total).mean())


def _distances(xc: torch.Tensor, centers: torch.Tensor, c_sq: torch.Tensor) -> torch.Tensor:
    """``‖c‖² − 2·x·cᵀ`` for one chunk: squared distances up to the per-row ``‖x‖²`` (argmin is unchanged)."""
    return torch.addmm(c_sq, xc, centers.T, beta=1, alpha=-2)


def _argmin_rows(block: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The column of each row's smallest value (the first one on ties, as scikit-learn).

    This is the hottest step of an iteration after the GEMM. On CPUs numpy's SIMD argmin
    is about twice as fast as torch's for rows of a few dozen values (docs/benchmarks.md).
    (Splitting it over Python threads was slower: they compete with torch's OpenMP threads.)
    """
    if block.device.type != "cpu":
        return torch.argmin(block, dim=1, out=out) if out is not None else block.argmin(dim=1)
    out = torch.empty(block.shape[0], dtype=torch.int64) if out is None else out
    np.argmin(block.numpy(), axis=1, out=out.numpy())
    return out


def _assign(x: torch.Tensor, centers: torch.Tensor, chunk: int) -> tuple[torch.Tensor, float]:
    """Closest centre of every row, and the local inertia, chunk by chunk."""
    c_sq = (centers * centers).sum(1)
    labels = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    inertia = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], chunk):
        xc = x[start:start + chunk]
        block = _distances(xc, centers, c_sq)
        # argmin then gather: torch's min(dim) returning values and indices is several times slower on CPUs
        nearest = labels[start:start + chunk] = _argmin_rows(block)
        best = block.gather(1, nearest[:, None]).squeeze(1)
        inertia += (best + (xc * xc).sum(1)).clamp_(min=0).sum(dtype=torch.float64)
    return labels, float(inertia)


def _inertia(x: torch.Tensor, centers: torch.Tensor, labels: torch.Tensor, chunk: int) -> float:
    """Sum of squared distances of the local rows to the centres of their labels."""
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], chunk):
        xc = x[start:start + chunk]
        total += ((xc - centers[labels[start:start + chunk]]) ** 2).sum(dtype=torch.float64)
    return float(total)


def _lloyd_pass(x: torch.Tensor, centers: torch.Tensor, labels: torch.Tensor, chunk: int, local: torch.Tensor,
                first: bool) -> int:
    """Assign every local row (updating ``labels`` in place), update the local sums and counts; return #changed.

    ``local`` packs this rank's per-cluster sums (k × d) and counts (k), in float64. On CPUs
    they are updated with the rows that changed cluster only (added to the new cluster,
    taken from the old one), which after the first iterations is a small fraction of the
    data; on GPUs they are recomputed with a one-hot GEMM (deterministic, unlike the atomics
    of ``index_add_`` there).
    """
    k, d = centers.shape
    c_sq = (centers * centers).sum(1)
    on_gpu = x.device.type != "cpu"
    if on_gpu or first:
        local.zero_()
    sums, counts = local[:k * d].view(k, d), local[k * d:k * d + k]
    changed = torch.zeros((), dtype=torch.int64, device=x.device)
    distances = torch.empty(min(chunk, x.shape[0]), k, dtype=x.dtype, device=x.device)
    nearest = torch.empty(min(chunk, x.shape[0]), dtype=torch.int64, device=x.device)
    part = torch.empty(k, d, dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[0], chunk):
        xc = x[start:start + chunk]
        block = torch.addmm(c_sq, xc, centers.T, beta=1, alpha=-2, out=distances[:len(xc)])
        old = labels[start:start + chunk]
        if on_gpu:
            new = _argmin_rows(block, nearest[:len(xc)])
            changed += (new != old).sum()
            onehot = block.zero_().scatter_(1, new[:, None], 1.0)
            sums += torch.mm(onehot.T, xc, out=part)
            counts += onehot.sum(0)
            old.copy_(new)
        elif first:
            new = _argmin_rows(block, nearest[:len(xc)])
            changed += len(xc)
            sums += part.zero_().index_add_(0, new, xc)
            counts += torch.bincount(new, minlength=k)
            old.copy_(new)
        else:
            # Most rows keep their cluster: a row whose current centre still attains its row's
            # minimum stays (a fast amin and gather), and only the others need an argmin.
            # (Only an exact tie with a lower-numbered centre could make argmin choose otherwise.)
            stays = block.gather(1, old[:, None]).squeeze(1) <= block.amin(dim=1)
            moved = torch.nonzero(~stays).squeeze(1)
            if len(moved):
                changed += len(moved)
                into, out_of, rows = _argmin_rows(block[moved]), old[moved], xc[moved]
                sums += part.zero_().index_add_(0, into, rows).index_add_(0, out_of, rows, alpha=-1)
                counts += torch.bincount(into, minlength=k) - torch.bincount(out_of, minlength=k)
                old[moved] = into
    return int(changed)


def _relocate_empty_clusters(x: torch.Tensor, centers: torch.Tensor, labels: torch.Tensor, sums: torch.Tensor,
                             counts: torch.Tensor) -> None:
    """scikit-learn's repair: each empty cluster takes one of the points farthest from their centres.

    Every rank offers its own farthest points; the candidates of all ranks are gathered and
    sorted (distance, then rank, then row) so every rank picks the same ones. The donors'
    sums and counts lose those points. ``sums`` and ``counts`` are changed in place.
    """
    empty = torch.nonzero(counts == 0).flatten()
    n_empty = len(empty)
    far = ((x - centers[labels]) ** 2).sum(1).double()
    take = min(n_empty, x.shape[0])
    values, rows = torch.topk(far, take)
    d = x.shape[1]
    # Each candidate travels as [distance, rank, row, label, features...], padded to n_empty rows.
    rank = dist.get_rank() if group_size() > 1 else 0
    offer = torch.full((n_empty, 4 + d), -math.inf, dtype=torch.float64, device=x.device)
    offer[:take, 0] = values
    offer[:take, 1] = rank
    offer[:take, 2] = rows.double()
    offer[:take, 3] = labels[rows].double()
    offer[:take, 4:] = x[rows].double()
    if group_size() > 1:
        gathered = [torch.empty_like(offer) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, offer)
        offer = torch.cat(gathered)
    order = sorted(range(len(offer)), key=lambda i: (-float(offer[i, 0]), float(offer[i, 1]), float(offer[i, 2])))
    for cluster, index in zip(empty.tolist(), order[:n_empty]):
        candidate = offer[index]
        donor = int(candidate[3])
        sums[donor] -= candidate[4:]
        counts[donor] -= 1
        sums[cluster] = candidate[4:]
        counts[cluster] = 1
