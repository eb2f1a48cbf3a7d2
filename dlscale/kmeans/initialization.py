"""Initial centres for :class:`dlscale.kmeans.KMeans`: k-means++, k-means|| and random.

- :func:`kmeans_plusplus` is scikit-learn's greedy k-means++ (Arthur & Vassilvitskii 2007):
  each new centre is the best of a few candidates drawn with probability ∝ D(x)². It needs
  every point's distance at every step, so it runs in one process.
- :func:`kmeans_parallel` is k-means|| (Bahmani et al., "Scalable K-Means++", VLDB 2012), its
  distributed form: a few rounds in which every rank samples its own points with probability
  ``ℓ·D(x)²/φ`` (φ the global cost), then a weighted k-means++ over the few hundred gathered
  candidates, computed identically on every rank.
- :func:`random_init` picks k distinct samples from the whole data set (uniformly, or ∝ weight).

With several ranks every function takes this rank's shard and returns the same centres on
every rank; the ``generator`` must be seeded identically everywhere. Every function takes
optional sample weights (float64, one per local row), which scale each row's chance as in
scikit-learn's weighted k-means++.
"""

from __future__ import annotations

import math

import torch

from dlscale.distributed import all_gather, all_reduce_sum, group_size, rank


def _world() -> tuple[int, int]:
    return rank(), group_size()


def _shard_offsets(n_local: int, device: torch.device) -> tuple[int, int]:
    """This rank's first global row, and the global number of rows."""
    rank, world = _world()
    sizes = torch.zeros(world, dtype=torch.float64, device=device)
    sizes[rank] = n_local
    sizes = all_reduce_sum(sizes).long().tolist()
    return sum(sizes[:rank]), sum(sizes)


def _rows_by_global_index(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """The rows with these global indices, gathered from whichever rank holds each (same result everywhere)."""
    offset, _ = _shard_offsets(x.shape[0], x.device)
    out = torch.zeros(len(indices), x.shape[1], dtype=torch.float64, device=x.device)
    local = (indices >= offset) & (indices < offset + x.shape[0])
    out[local] = x[(indices[local] - offset).to(x.device)].double()
    return all_reduce_sum(out).to(x.dtype)


def random_init(
    x: torch.Tensor, k: int, generator: torch.Generator, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """``k`` distinct samples drawn from all ranks' data: uniformly, or with probability ∝ weight.

    The weighted draw is without replacement, as scikit-learn's ``choice(p=w / w.sum())``:
    every row gets the key ``log(u) / w`` (Efraimidis & Spirakis 2006) and the k largest keys
    over all ranks win, so each rank sends only its own k best.
    """
    if weights is None:
        _, total = _shard_offsets(x.shape[0], x.device)
        chosen = torch.randperm(total, generator=generator)[:k].to(x.device)
        return _rows_by_global_index(x, chosen)
    local = _rank_generator(generator)
    keys = torch.rand(x.shape[0], generator=local, dtype=torch.float64).to(x.device).log_() / weights
    best = torch.topk(keys, min(k, x.shape[0]))
    offers = _gather_rows(torch.cat([best.values[:, None], x[best.indices].double()], 1))
    return offers[torch.topk(offers[:, 0], k).indices, 1:].to(x.dtype)


def _rank_generator(generator: torch.Generator) -> torch.Generator:
    """This rank's own stream, derived from the shared one (every rank draws the same seed from it)."""
    rank, _ = _world()
    return torch.Generator().manual_seed(int(torch.randint(2**62, (1,), generator=generator)) + rank)


def _closest_sq(x: torch.Tensor, centers: torch.Tensor, chunk: int) -> torch.Tensor:
    """Squared distance of every row to its closest centre (float64), chunk by chunk."""
    c_sq = (centers * centers).sum(1)
    out = torch.empty(x.shape[0], dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], chunk):
        xc = x[start : start + chunk]
        block = torch.addmm(c_sq, xc, centers.T, beta=1, alpha=-2).min(dim=1).values
        out[start : start + chunk] = (block + (xc * xc).sum(1)).clamp_(min=0).double()
    return out


def kmeans_plusplus(
    x: torch.Tensor,
    k: int,
    generator: torch.Generator,
    n_local_trials: int | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Greedy k-means++ on the rows of ``x`` (optionally weighted), in one process, as scikit-learn does it.

    Distances to the candidates are one GEMM each step (``‖x‖² − 2·x·cᵀ + ‖c‖²`` in the data's
    precision, as scikit-learn computes them); potentials and the sampling sums are float64.
    """
    n = x.shape[0]
    weights = torch.ones(n, dtype=torch.float64, device=x.device) if weights is None else weights.double()
    trials = n_local_trials or 2 + int(math.log(k))
    x_sq = (x * x).sum(1)

    def sq_distances(rows: torch.Tensor) -> torch.Tensor:  # (len(rows), n)
        block = torch.addmm(x_sq.expand(len(rows), n), rows, x.T, alpha=-2)
        return block.add_((rows * rows).sum(1)[:, None]).clamp_(min=0)

    weight_sums = torch.cumsum(weights, 0)

    def draw(cumulative: torch.Tensor, count: int, total: float) -> torch.Tensor:
        """Rows drawn with probability ∝ their share of ``cumulative`` (no 2^24 limit, unlike multinomial)."""
        draws = torch.rand(count, generator=generator, dtype=torch.float64).to(x.device) * total
        return torch.searchsorted(cumulative, draws).clamp_(max=n - 1)

    first = int(draw(weight_sums, 1, float(weight_sums[-1]))[0])
    centers = [x[first]]
    closest = sq_distances(x[first][None])[0]
    potential = float((closest * weights).sum())
    for _ in range(1, k):
        if potential <= 0:  # fewer distinct points than k: repeat one rather than divide by zero
            centers.append(x[int(draw(weight_sums, 1, float(weight_sums[-1]))[0])])
            continue
        candidates = draw(torch.cumsum(closest * weights, 0), trials, potential)
        trial_closest = torch.minimum(closest[None], sq_distances(x[candidates]))
        trial_potential = (trial_closest * weights).sum(1)
        best = int(torch.argmin(trial_potential))
        closest, potential = trial_closest[best], float(trial_potential[best])
        centers.append(x[int(candidates[best])])
    return torch.stack(centers).clone()


def kmeans_parallel(
    x: torch.Tensor,
    k: int,
    generator: torch.Generator,
    chunk: int,
    oversampling: float | None = None,
    rounds: int = 5,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """k-means|| over all ranks' shards: ``rounds`` of oversampling (ℓ = 2k by default), then weighted k-means++.

    ``chunk`` is the rows of a distance block against k centres; against more candidates a block
    has fewer rows, so no block is larger than ``chunk × k``.

    With sample weights a row's chance is ∝ its weight × D(x)², as in weighted k-means++, and
    each candidate is weighted by the total weight of the rows closest to it.
    """
    ell = oversampling or 2.0 * k
    budget = chunk * k  # the chunk's distance block is sized for k columns: blocks of more keep its elements
    candidates = random_init(x, 1, generator, weights)
    closest = _closest_sq(x, candidates, chunk)
    # Each rank samples its own points with its own stream, derived from the shared seed.
    local = _rank_generator(generator)
    for _ in range(rounds):
        potential = closest if weights is None else closest * weights
        cost = float(all_reduce_sum(potential.sum().reshape(1))[0])
        if cost <= 0:
            break
        keep = torch.rand(x.shape[0], generator=local, dtype=torch.float64).to(x.device) < ell * potential / cost
        new = _gather_rows(x[keep])
        if len(new) == 0:
            continue
        candidates = torch.cat([candidates, new])
        closest = torch.minimum(closest, _closest_sq(x, new, max(1, budget // len(new))))
    # Weight each candidate by the points closest to it, then reduce the candidates to k. (About ℓ·rounds
    # candidates, ten times k: the rows per block shrink to match, or a GPU's block would be 1.3 GB at 1M rows.)
    rows = max(1, budget // len(candidates))
    labels = torch.cat(
        [
            torch.addmm((candidates * candidates).sum(1), x[s : s + rows], candidates.T, alpha=-2).argmin(1)
            for s in range(0, x.shape[0], rows)
        ]
    )
    candidate_weights = all_reduce_sum(torch.bincount(labels, weights=weights, minlength=len(candidates)).double())
    if len(candidates) <= k:  # too few distinct candidates: top up with random samples
        return torch.cat([candidates, random_init(x, k - len(candidates), generator, weights)])
    return kmeans_plusplus(candidates, k, generator, weights=candidate_weights)


def _gather_rows(rows: torch.Tensor) -> torch.Tensor:
    """Every rank's ``rows`` concatenated in rank order, on every rank."""
    _, world = _world()
    if world == 1:
        return rows
    counts = torch.zeros(world, dtype=torch.int64, device=rows.device)
    counts[_world()[0]] = len(rows)
    counts = all_reduce_sum(counts).tolist()
    padded = torch.zeros(max(counts), rows.shape[1], dtype=rows.dtype, device=rows.device)
    padded[: len(rows)] = rows
    return torch.cat([block[:count] for block, count in zip(all_gather(padded), counts)])
