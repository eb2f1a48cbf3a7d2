"""Scoring rows against centres: the nearest centre of each row, and the (weighted) inertia.

Distances are ``‖c‖² − 2·x·cᵀ`` per chunk of rows (one GEMM each, so memory is chunk × k);
``‖x‖²`` is added only where a distance itself is needed. Used by the Lloyd engine and by
``predict`` and ``score``.
"""

from __future__ import annotations

import numpy as np
import torch

from dlscale.kmeans import compiled_scoring


def argmin_rows(block: torch.Tensor) -> torch.Tensor:
    """The column of each row's smallest value (the first one on ties, as scikit-learn).

    On CPUs numpy's SIMD argmin is about twice as fast as torch's for rows of a few dozen
    values (docs/benchmarks.md).
    """
    if block.device.type != "cpu":
        return block.argmin(dim=1)
    out = torch.empty(block.shape[0], dtype=torch.int64)
    np.argmin(block.numpy(), axis=1, out=out.numpy())
    return out


def _weighted_inertia(squared: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    squared = squared.clamp(min=0).double()
    return (squared if weights is None else squared * weights).sum()


def assign(
    x: torch.Tensor,
    centers: torch.Tensor,
    chunk: int,
    weights: torch.Tensor | None = None,
    compiled: bool | None = None,
) -> tuple[torch.Tensor, float]:
    """Closest centre of every local row, and the local (weighted) inertia, chunk by chunk.

    On CPUs with numba (``compiled`` None or True) by the compiled loop of the CPU engine, so
    ``predict`` gives exactly the labels a fit found; otherwise one GEMM per chunk.
    """
    if compiled or (compiled is None and x.device.type == "cpu" and compiled_scoring.available()):
        labels, squared = compiled_scoring.nearest(x, centers)
        return labels, float(_weighted_inertia(squared, weights))
    c_sq = (centers * centers).sum(1)
    labels = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    inertia = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], chunk):
        xc = x[start : start + chunk]
        block = torch.addmm(c_sq, xc, centers.T, alpha=-2)
        # argmin then gather: torch's min(dim) returning values and indices is several times slower on CPUs
        nearest = labels[start : start + chunk] = argmin_rows(block)
        best = block.gather(1, nearest[:, None]).squeeze(1) + (xc * xc).sum(1)
        inertia += _weighted_inertia(best, None if weights is None else weights[start : start + chunk])
    return labels, float(inertia)


def inertia_of(
    x: torch.Tensor, centers: torch.Tensor, labels: torch.Tensor, chunk: int, weights: torch.Tensor | None = None
) -> float:
    """Sum of (weighted) squared distances of the local rows to the centres of their labels.

    On CPUs with numba by a compiled loop in float64 (no chunk-sized temporaries); otherwise by chunks.
    """
    if x.device.type == "cpu" and compiled_scoring.available():
        return compiled_scoring.inertia(x, centers, labels, weights)
    return float(_weighted_inertia(squared_distances(x, centers, labels, chunk), weights))


def squared_distances(x: torch.Tensor, centers: torch.Tensor, labels: torch.Tensor, chunk: int) -> torch.Tensor:
    """Each local row's squared distance to the centre of its label, float64, chunk by chunk: for the whole data at
    once the temporaries (two of n × d) would take more than the data again, on a GPU past its memory."""
    squared = torch.empty(x.shape[0], dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], chunk):
        part = slice(start, start + chunk)
        squared[part] = ((x[part] - centers[labels[part]]) ** 2).sum(1)
    return squared
