"""Lesson 08, distributed K-Means: its exercise check (08.1)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dlscale.lessons.lesson_tools import passed, require_filled_in

#: What the lesson's notebooks import through dlscale.lab (the door reads it from here).
__all__ = [
    "check_centre_update",
]

# -- the exercise's check ------------------------------------------------------------------------------------


def _kmeans_shards() -> tuple[torch.Tensor, torch.Tensor, list[slice]]:
    """08.1's data: 3 clusters' labels on 2 unequal shards (a mean of the ranks' means would be wrong)."""
    generator = torch.Generator().manual_seed(8)
    x = torch.randn(50, 4, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 3, (50,), generator=generator)
    labels[:3] = torch.tensor([0, 1, 2])  # every cluster has a member on rank 0
    return x, labels, [slice(0, 12), slice(12, 50)]


def _previous_centres() -> torch.Tensor:
    """The centres before the update: 4 of them, and no sample on any rank is labelled 3 (an empty cluster)."""
    return torch.arange(16, dtype=torch.float64).reshape(4, 4)


def _centre_update_on_rank(update_centers: Callable) -> tuple[torch.Tensor, int]:
    """Run on one engine: the learner's update on this rank's shard, and how many all-reduces it made."""
    import os

    import torch.distributed as dist

    from dlscale import distributed

    x, labels, shards = _kmeans_shards()
    shard = shards[int(os.environ["RANK"])]
    previous = _previous_centres()
    distributed.init("cpu")
    calls = []
    original = dist.all_reduce

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    dist.all_reduce = counting
    try:
        return update_centers(x[shard], labels[shard], previous), len(calls)
    finally:
        dist.all_reduce = original
        distributed.shutdown(drain=False)  # the engine lives on; a failed answer may have left a rank behind


def check_centre_update(update_centers: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """08.1: new centres from each rank's local sums and counts, with a single all-reduce; an empty cluster
    keeps its centre."""
    from dlscale.jobs.notebook_engines import EngineError, run_on_engines

    require_filled_in(update_centers)
    try:
        results = run_on_engines(_centre_update_on_rank, 2, update_centers, timeout=120)
    except EngineError as err:
        if "NotImplementedError" in str(err):
            raise NotImplementedError(str(err).split("NotImplementedError: ", 1)[1].split(";")[0]) from None
        raise
    x, labels, _ = _kmeans_shards()
    expected = torch.cat([torch.stack([x[labels == c].mean(0) for c in range(3)]), _previous_centres()[3:]])
    for rank, (centres, calls) in enumerate(results):
        assert not torch.isnan(centres).any(), (
            f"rank {rank} returned NaN for cluster(s) {torch.isnan(centres).any(1).nonzero().flatten().tolist()}: "
            f"no sample on any rank chose them, so their count is 0 and 0/0 is NaN; keep their previous centre"
        )
        assert torch.allclose(centres[3].double(), expected[3]), (
            f"rank {rank} moved the empty cluster 3 to {centres[3].tolist()}: a cluster no sample chose keeps its "
            f"previous centre"
        )
        assert torch.allclose(centres.double(), expected, atol=1e-10), (
            f"rank {rank}'s centres differ from the means over all samples: all-reduce the per-cluster sums AND "
            f"the counts, then divide (the mean of the ranks' means is wrong when their shares differ)"
        )
        assert calls == 1, (
            f"rank {rank} made {calls} all-reduce calls: pack the sums and the counts into one "
            f"tensor and all-reduce it once (one message per iteration, not two)"
        )
    passed("08.1")
