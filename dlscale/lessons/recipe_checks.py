"""Checks for the exercises that add recipe lines to the plain loop (03.2 mixed precision, 05.3 data parallel).

Each runs the learner's loop (on two real ranks where it is distributed) against a reference on
data chosen so that the usual mistakes change the result, and names the mistake it recognises:
clipping before ``unscale_``, no ``set_epoch``, a logged loss that is not all-reduced, a sampler
whose shares are wrong when the data do not divide, a checkpoint written by every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, DistributedSampler

from dlscale.lessons.checks import _on_two_engines, _passed, regression_problem

# -- 03.2: mixed precision with a scaler, in the plain loop -------------------------------------------

#: 03.2's clip threshold: small enough that clipping the true gradients changes every step.
CLIP = 0.05


def _amp_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = regression_problem(n=64, seed=3)
    return [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]


def _amp_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def _amp_loop(order: str) -> nn.Module:
    """03.2's loop done right (``"unscale, clip"``), or with a named mistake, for the comparison."""
    model = _amp_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=order != "no scaler")
    for x, y in _amp_batches():
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if order == "unscale, clip":
            scaler.unscale_(optimizer)
        if order != "no clipping":
            nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        scaler.step(optimizer)
        scaler.update()
    return model


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.allclose(p, q, atol=1e-6) for p, q in zip(a.parameters(), b.parameters()))


def check_mixed_precision_loop(train_fp16: Callable[[nn.Module, list, float, float], None]) -> None:
    """03.2: fp16 autocast with a GradScaler, and clipping of the true (unscaled) gradients, in the plain loop."""
    model = _amp_model()
    train_fp16(model, _amp_batches(), 0.1, CLIP)
    mistakes = {"clip then unscale": "clipping before scaler.unscale_(optimizer): the clip compared the scaled "
                                     "gradients (thousands of times too large) with the threshold",
                "no clipping": "no clipping: clip with torch.nn.utils.clip_grad_norm_(model.parameters(), clip) "
                               "after scaler.unscale_(optimizer)",
                "no scaler": "no GradScaler: scale the loss (scaler.scale(loss).backward()), step through "
                             "scaler.step(optimizer) and call scaler.update()"}
    if not _same_weights(model, _amp_loop("unscale, clip")):
        named = next((message for order, message in mistakes.items() if _same_weights(model, _amp_loop(order))), None)
        raise AssertionError(named or "the weights differ from the reference: autocast the forward pass and the "
                                      "loss, then scale, backward, unscale_, clip, step and update")
    _passed("03.2")


# -- 05.3: the plain loop made data-parallel ---------------------------------------------------------

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
            rows = [i for share in shares for i in share[step * per_rank:(step + 1) * per_rank]]
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(data.x[rows]), data.y[rows])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def check_data_parallel_loop(train_data_parallel: Callable[[Dataset, int, int, float, str], list[float]]) -> None:
    """05.3: the plain loop on 2 ranks takes the steps one process takes on each global batch, and names the
    usual mistakes: the shares of 101 samples, set_epoch, the logged loss, the checkpoint's writers."""
    ranks = _on_two_engines(_data_parallel_on_rank, train_data_parallel, "checkpoint-05.3.pt")
    share = SAMPLES // 2
    for rank, result in enumerate(ranks):
        epochs = [result["seen"][i * share:(i + 1) * share] for i in range(EPOCHS)]
        assert len(result["seen"]) == EPOCHS * share and all(len(set(e)) == share for e in epochs), (
            f"rank {rank} read {len(result['seen'])} samples in {EPOCHS} epochs, expected {share} distinct ones per "
            f"epoch: the sampler's share size is wrong when the data do not divide ({SAMPLES} over 2 ranks). "
            f"Use DistributedSampler(dataset, num_replicas=world_size, rank=rank, drop_last=True): without "
            f"drop_last it pads the shares with repeated samples")
        assert epochs[0] != epochs[1], (
            f"rank {rank} read the same order in both epochs: call sampler.set_epoch(epoch) at the start of every "
            f"epoch (the sampler seeds its shuffle with seed + epoch)")
    first = [set(ranks[0]["seen"][:share]), set(ranks[1]["seen"][:share])]
    assert not first[0] & first[1], "the ranks read the same samples: give each rank its own share (rank=rank)"
    assert ranks[0]["losses"] == ranks[1]["losses"], (
        "the ranks logged different losses: the metrics are not all-reduced. Log the global batch's loss: "
        "dist.all_reduce a copy of the loss (SUM), then divide by the world size")
    writers = [rank for rank, result in enumerate(ranks) if result["saves"]]
    assert writers == [0], (
        f"the checkpoint was written by rank(s) {writers}: a checkpoint written by every rank races for one "
        f"file; only rank 0 should write (the ranks hold the same weights)" if writers else
        "no rank wrote the checkpoint: rank 0 should torch.save it at the end of every epoch")
    expected = reference_losses()
    assert len(ranks[0]["losses"]) == len(expected) and all(
        abs(a - b) < 1e-5 for a, b in zip(ranks[0]["losses"], expected)), (
        "the losses differ from one process training on each global batch: wrap the model in "
        "DistributedDataParallel (it averages the gradients) and give each rank batch_size // world_size samples")
    _passed("05.3")
