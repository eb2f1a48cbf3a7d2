"""Lesson 05, data-parallel training: its question, reading, conclusion and exercise checks (05.1-05.3)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, DistributedSampler

from dlscale.lessons.lesson_tools import Question, Reading, as_number, on_two_engines, passed, regression_problem

#: What the lesson's notebooks import through dlscale.lab (the door reads it from here).
__all__ = [
    "STRONG_SCALING",
    "TWO_RANK_EFFICIENCY",
    "check_data_parallel_loop",
    "check_global_mse",
    "check_shard_indices",
    "efficiency_conclusion",
]

# -- asked before the measurement ----------------------------------------------------------------------------


def _strong_scaling(rows: list[dict[str, Any]]) -> str | None:
    efficiency = next(
        (r["efficiency"] for r in rows if r["mode"] == "strong" and r["processes"] > min(q["processes"] for q in rows)),
        None,
    )
    if efficiency is None:
        return None
    return "a" if efficiency >= 0.9 else "b" if efficiency >= 0.5 else "c"


STRONG_SCALING = Question(
    "two ranks on this machine split the same global batch (strong scaling); the efficiency is...",
    {"a": "90% or more", "b": "between 50% and 90%", "c": "below 50%"},
    _strong_scaling,
)

# -- read from the attendee's numbers ------------------------------------------------------------------------


def _efficiency(measurement, one: Any, many: Any, ranks: int) -> tuple[Callable[[Any], bool], str]:
    single, several = measurement.spreads[one], measurement.spreads[many]
    efficiency = 100 * several.median / (ranks * single.median)
    low, high = 100 * several.low / (ranks * single.high), 100 * several.high / (ranks * single.low)
    shows = (
        f"{ranks} ranks {several.median:,.0f} samples/s against one rank's {single.median:,.0f}: an efficiency of "
        f"{efficiency:.0f}% (the rounds allow {low:.0f}-{high:.0f}%)"
    )
    return (lambda answer: (n := as_number(answer)) is not None and low - 5 <= n <= high + 5), shows


TWO_RANK_EFFICIENCY = Reading(
    "what is your stage's strong-scaling efficiency on two ranks, in percent: the two "
    "ranks' samples/s over twice one rank's?",
    "a number, ±5",
    _efficiency,
)

# -- ours, from their numbers --------------------------------------------------------------------------------


def efficiency_conclusion(rows: list[dict[str, Any]]) -> list[str]:
    """Scaling rows (``bench_scaling``): the efficiency per mode, and whether both sides had the same threads."""
    threads = {r.get("threads_per_process") for r in rows}
    lines = [
        f"every process had {threads.pop()} thread(s)"
        if len(threads) == 1
        else f"warning: the runs had different threads per process ({sorted(map(str, threads))}): "
        "their efficiencies are not comparable"
    ]
    for row in rows:
        if row["processes"] > min(r["processes"] for r in rows):
            note = (
                " (above 100%: look for a cache effect, or a noisy single-process run)"
                if row["efficiency"] > 1.05
                else ""
            )
            lines.append(
                f"{row['mode']} scaling to {row['processes']} processes: {100 * row['efficiency']:.0f}% "
                f"efficiency{note}"
            )
    return lines


# -- 05.1 and 05.2: a rank's share, a metric over all ranks --------------------------------------------------


def check_shard_indices(shard_indices: Callable[[int, int, int, int, int], list[int]]) -> None:
    """05.1: this rank's indices for an epoch, as a DistributedSampler (shuffled, drop_last) gives them."""
    from torch.utils.data import DistributedSampler

    for size, world, epoch in ((103, 4, 0), (64, 2, 3)):
        shards = [list(shard_indices(size, rank, world, epoch, 7)) for rank in range(world)]
        flat = [i for shard in shards for i in shard]
        assert len(flat) == len(set(flat)), "a sample appears on two ranks: each rank needs a disjoint share"
        assert all(len(s) == size // world for s in shards), (
            f"every rank should get {size // world} samples (drop the remainder, so all ranks take the same steps)"
        )
        for rank, shard in enumerate(shards):
            expected = (
                list(
                    DistributedSampler(
                        range(size), num_replicas=world, rank=rank, shuffle=True, seed=7, drop_last=True
                    ).__iter__()
                )
                if epoch == 0
                else None
            )
            if expected is not None:
                assert shard == expected, (
                    "use torch.utils.data.DistributedSampler(range(n), ..., seed=seed, drop_last=True)"
                )
        again = [list(shard_indices(size, 0, world, epoch + 1, 7))]
        assert again[0] != shards[0], "call sampler.set_epoch(epoch): each epoch needs a new order"
    passed("05.1")


def _global_metric_on_rank(global_mse: Callable, local_sum: float, local_count: int) -> float:
    """Run on one engine: join the job's process group, call the learner's function, leave."""
    from dlscale import distributed

    distributed.init("cpu")
    try:
        return float(global_mse(torch.tensor(local_sum, dtype=torch.float64), torch.tensor(local_count)))
    finally:
        distributed.shutdown(drain=False)  # the engine lives on; a failed answer may have left a rank behind


def check_global_mse(global_mse: Callable[[torch.Tensor, torch.Tensor], float]) -> None:
    """05.2: the mean squared error over all ranks' samples, from each rank's sum and count (two real ranks)."""
    sums, counts = [3.0, 30.0], [10, 20]  # unequal shares: the mean of the ranks' means would be wrong
    answers = on_two_engines(_pair_member, global_mse, sums, counts)
    expected = sum(sums) / sum(counts)
    assert all(abs(a - expected) < 1e-9 for a in answers), (
        f"ranks returned {answers}, expected {expected} on both: all-reduce the sums and the counts (SUM), then "
        f"divide; the mean of the ranks' means is wrong when their shares differ"
    )
    passed("05.2")


def _pair_member(global_mse: Callable, sums: list[float], counts: list[int]) -> float:
    import os

    rank = int(os.environ["RANK"])
    return _global_metric_on_rank(global_mse, sums[rank], counts[rank])


# -- 05.3: the plain loop made data-parallel -----------------------------------------------------------------


#: 05.3's data: 101 samples, which do not divide over 2 ranks; a global batch of 10, 2 epochs, SGD.
SAMPLES, BATCH, EPOCHS, LR = 101, 10, 2, 0.05


class RecordingDataset(Dataset):
    """05.3's regression samples; remembers which indices this process read, in order."""

    def __init__(self) -> None:
        self.x, self.y = regression_problem(n=SAMPLES, seed=5)
        self.seen: list[int] = []

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.seen.append(int(index))
        return self.x[index], self.y[index]


def _data_parallel_on_rank(train_data_parallel: Callable, checkpoint: str) -> dict[str, Any]:
    """Run on an engine: the learner's loop on a recording dataset, with every ``torch.save`` call noted."""
    dataset, saves, real_save = RecordingDataset(), [], torch.save

    def noting_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        saves.append(str(f))
        return real_save(obj, f, *args, **kwargs)

    torch.save = noting_save
    try:
        losses = train_data_parallel(dataset, EPOCHS, BATCH, LR, checkpoint)
    finally:
        torch.save = real_save
    return {"losses": [float(v) for v in losses], "seen": dataset.seen, "saves": saves}


def reference_losses(world_size: int = 2) -> list[float]:
    """05.3's losses in one process: each step on the union of the ranks' shares of that step (DDP's average)."""
    data = RecordingDataset()
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    per_rank, losses = BATCH // world_size, []
    for epoch in range(EPOCHS):
        shares = []
        for rank in range(world_size):
            sampler = DistributedSampler(range(SAMPLES), num_replicas=world_size, rank=rank, seed=0, drop_last=True)
            sampler.set_epoch(epoch)
            shares.append(list(sampler))
        for step in range(len(shares[0]) // per_rank):
            rows = [i for share in shares for i in share[step * per_rank : (step + 1) * per_rank]]
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(data.x[rows]), data.y[rows])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def check_data_parallel_loop(train_data_parallel: Callable[[Dataset, int, int, float, str], list[float]]) -> None:
    """05.3: the plain loop on 2 ranks takes the steps one process takes on each global batch, and names the
    usual mistakes: the shares of 101 samples, set_epoch, the logged loss, the checkpoint's writers."""
    folder = Path("runs/exercises").resolve()  # (with the lesson's runs, not beside the notebook)
    folder.mkdir(parents=True, exist_ok=True)
    ranks = on_two_engines(_data_parallel_on_rank, train_data_parallel, str(folder / "checkpoint-05.3.pt"))
    share = SAMPLES // 2
    for rank, result in enumerate(ranks):
        epochs = [result["seen"][i * share : (i + 1) * share] for i in range(EPOCHS)]
        assert len(result["seen"]) == EPOCHS * share and all(len(set(e)) == share for e in epochs), (
            f"rank {rank} read {len(result['seen'])} samples in {EPOCHS} epochs, expected {share} distinct ones per "
            f"epoch: the sampler's share size is wrong when the data do not divide ({SAMPLES} over 2 ranks). "
            f"Use DistributedSampler(dataset, num_replicas=world_size, rank=rank, drop_last=True): without "
            f"drop_last it pads the shares with repeated samples"
        )
        assert epochs[0] != epochs[1], (
            f"rank {rank} read the same order in both epochs: call sampler.set_epoch(epoch) at the start of every "
            f"epoch (the sampler seeds its shuffle with seed + epoch)"
        )
    first = [set(ranks[0]["seen"][:share]), set(ranks[1]["seen"][:share])]
    assert not first[0] & first[1], "the ranks read the same samples: give each rank its own share (rank=rank)"
    assert ranks[0]["losses"] == ranks[1]["losses"], (
        "the ranks logged different losses: the metrics are not all-reduced. Log the global batch's loss: "
        "dist.all_reduce a copy of the loss (SUM), then divide by the world size"
    )
    writers = [rank for rank, result in enumerate(ranks) if result["saves"]]
    assert writers == [0], (
        f"the checkpoint was written by rank(s) {writers}: a checkpoint written by every rank races for one "
        f"file; only rank 0 should write (the ranks hold the same weights)"
        if writers
        else "no rank wrote the checkpoint: rank 0 should torch.save it at the end of every epoch"
    )
    expected = reference_losses()
    assert len(ranks[0]["losses"]) == len(expected) and all(
        abs(a - b) < 1e-5 for a, b in zip(ranks[0]["losses"], expected)
    ), (
        "the losses differ from one process training on each global batch: wrap the model in "
        "DistributedDataParallel (it averages the gradients) and give each rank batch_size // world_size samples"
    )
    passed("05.3")
