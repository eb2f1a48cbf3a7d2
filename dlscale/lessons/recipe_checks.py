"""Checks for the exercises that add recipe lines to the plain loop (03.2 mixed precision, 05.3 data parallel).

Each runs the learner's loop (on two real ranks where it is distributed) against a reference on
data chosen so that the usual mistakes change the result, and names the mistake it recognises:
clipping before ``unscale_``, no ``set_epoch``, a logged loss that is not all-reduced, a sampler
whose shares are wrong when the data do not divide, a checkpoint written by every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
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
    return [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]


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
    mistakes = {
        "clip then unscale": "clipping before scaler.unscale_(optimizer): the clip compared the scaled "
        "gradients (thousands of times too large) with the threshold",
        "no clipping": "no clipping: clip with torch.nn.utils.clip_grad_norm_(model.parameters(), clip) "
        "after scaler.unscale_(optimizer)",
        "no scaler": "no GradScaler: scale the loss (scaler.scale(loss).backward()), step through "
        "scaler.step(optimizer) and call scaler.update()",
    }
    if not _same_weights(model, _amp_loop("unscale, clip")):
        named = next((message for order, message in mistakes.items() if _same_weights(model, _amp_loop(order))), None)
        raise AssertionError(
            named
            or "the weights differ from the reference: autocast the forward pass and the "
            "loss, then scale, backward, unscale_, clip, step and update"
        )
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
    ranks = _on_two_engines(_data_parallel_on_rank, train_data_parallel, str(folder / "checkpoint-05.3.pt"))
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
    _passed("05.3")


# -- 07.3: LR scaling and warmup, in the plain loop --------------------------------------------------

#: 07.3's setting: an LR tuned at batch 32, a run at batch 256 of 40 steps, 8 of them warmup.
SCHEDULE = {"lr": 0.01, "batch_size": 256, "base_batch": 32, "warmup_steps": 8, "total_steps": 40}


def _lr_trace(optimizer: torch.optim.Optimizer, scheduler: Any, steps: int) -> list[float]:
    trace = []
    for _ in range(steps):
        trace.append(optimizer.param_groups[0]["lr"])
        optimizer.step()  # (no gradients: nothing moves, only the schedule advances)
        scheduler.step()
    return trace


def check_lr_schedule(scaled_schedule: Callable[..., tuple[torch.optim.Optimizer, Any]]) -> None:
    """07.3: the linearly scaled peak LR, warmup from the unscaled LR, then a cosine to 0, as a LambdaLR."""
    from dlscale.optim.schedules import lr_trace

    s = SCHEDULE
    optimizer, scheduler = scaled_schedule(nn.Linear(4, 1), **s)
    trace = _lr_trace(optimizer, scheduler, s["total_steps"])
    peak = s["lr"] * s["batch_size"] / s["base_batch"]
    expected = lr_trace(peak, s["warmup_steps"], s["total_steps"], "cosine", s["lr"] / peak)
    if all(abs(a - b) <= 1e-9 * peak for a, b in zip(trace, expected)):
        return _passed("07.3")
    top = max(trace)
    if abs(top - s["lr"]) < 1e-12:
        raise AssertionError(
            f"the LR never exceeds {s['lr']}: it is not scaled. With a batch {s['batch_size'] // s['base_batch']}"
            f"x larger take {s['batch_size'] // s['base_batch']}x fewer steps of a "
            f"{s['batch_size'] // s['base_batch']}x larger LR: lr * batch_size / base_batch"
        )
    if abs(top - s["lr"] * (s["batch_size"] / s["base_batch"]) ** 0.5) < 1e-9:
        raise AssertionError(
            "the peak is lr * sqrt(k): that is the square-root rule; this exercise asks for the "
            "linear one, lr * batch_size / base_batch"
        )
    if trace[0] == 0:
        raise AssertionError(
            "the first step's LR is 0: the first step would not move. Start the warmup at the "
            "unscaled lr (a factor of lr / peak at step 0)"
        )
    if abs(trace[0] - peak) < 1e-9:
        raise AssertionError(
            f"the first step already takes the peak LR {peak:g}: no warmup. Rise linearly from lr to "
            f"the peak over warmup_steps steps"
        )
    raise AssertionError(
        f"the LR by step differs from the reference: got {[round(v, 4) for v in trace[:10]]}..., "
        f"expected {[round(v, 4) for v in expected[:10]]}...: warmup from lr to the peak over "
        f"warmup_steps, then 0.5 * (1 + cos(pi * progress)) down to 0 at total_steps"
    )


# -- 10.3: FSDP2 on the transformer's blocks ----------------------------------------------------------


def _small_vit() -> nn.Module:
    from dlscale.models import ViTRegressor

    torch.manual_seed(0)
    return ViTRegressor(image_size=8, patch_size=4, width=16, depth=2, heads=2)


def _vit_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(10)
    return [(torch.randn(8, 1, 8, 8, generator=generator), torch.randn(8, 3, generator=generator)) for _ in range(3)]


def _train_vit(model: nn.Module, rank: int = 0, ranks: int = 1) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in _vit_batches():
        share = slice(rank * len(x) // ranks, (rank + 1) * len(x) // ranks)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x[share]), y[share])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _fsdp_on_rank(shard: Callable) -> dict[str, Any]:
    """Run on an engine: the learner's sharding of the small ViT, which units it made, and its training losses."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    from dlscale import distributed

    distributed.init("cpu")
    finished = False
    try:
        model = _small_vit()
        shard(model, init_device_mesh("cpu", (dist.get_world_size(),)))
        units = {"blocks": [isinstance(b, FSDPModule) for b in model.blocks], "root": isinstance(model, FSDPModule)}
        local = _train_vit(model, int(os.environ["RANK"]), dist.get_world_size())
        mean = torch.tensor(local)
        dist.all_reduce(mean)
        finished = True
        return {**units, "losses": (mean / dist.get_world_size()).tolist()}
    finally:
        distributed.shutdown(drain=finished)  # (after a failure a peer may be stuck: no barrier then)


def check_fsdp_sharding(shard: Callable[[nn.Module, Any], None]) -> None:
    """10.3: fully_shard on each block, then on the root, over the mesh: 2 ranks train as one process does."""
    try:
        ranks = _on_two_engines(_fsdp_on_rank, shard)
    except Exception as err:  # (FSDP2 refuses a root sharded before its blocks)
        if "NotImplementedError" in type(err).__name__:
            raise
        raise AssertionError(
            f"sharding failed on the ranks ({str(err)[:300]}): call fully_shard(block, mesh=mesh) "
            f"for each block first, then fully_shard(model, mesh=mesh)"
        ) from None
    result = ranks[0]
    assert all(result["blocks"]), (
        "the blocks are not FSDP units: with only the root sharded, every parameter is gathered at once and the "
        "memory saving is lost. Call fully_shard(block, mesh=mesh) on each of model.blocks"
    )
    assert result["root"], (
        "the root is not sharded: the patch embedding, the norm and the head stay whole on every "
        "rank, and their gradients are never averaged. Call fully_shard(model, mesh=mesh) last"
    )
    expected = _train_vit(_small_vit())
    assert all(abs(a - b) < 1e-5 for a, b in zip(result["losses"], expected)), (
        f"the sharded ranks' losses {result['losses']} differ from one process's {expected}"
    )
    _passed("10.3")


# -- the lesson's stage, written by the attendee: gap by gap, then against the engine (stage_check.py) -----------
from dlscale.lessons.stage_check import STAGE_TOLERANCE, check_gaps, check_stage  # noqa: E402 F401  (the lessons' names)
