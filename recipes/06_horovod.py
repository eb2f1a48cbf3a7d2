# recipes/06_horovod.py
"""A plain PyTorch training loop for the mini-CosmoFlow maps: stage 06 of the recipe (lesson 06).

Copy it, with training_tools.py beside it, into your own project: only the data set comes from dlscale
(any Dataset of (input, target) pairs will do). Each stage logs the loss and samples/s per block of
steps and resumes from its checkpoint; each later stage adds one capability (`diff` two stages).
Stage 02 reads the batches in worker processes, into pinned memory on a GPU. Stage 03 runs the
forward pass in bf16 or fp16 (with loss scaling) and clips the gradient norm. Stage 04 names the
forward, backward and optimizer step for the profilers, records a window of steps, and compiles.
Stage 05 trains on every GPU of the job, one process each, with DistributedDataParallel, and can
accumulate gradients over micro-batches; stage 06 does the same with Horovod's five changes
(hvd.init, one GPU per rank, the rank's share of the data, DistributedOptimizer, rank 0's start):

    horovodrun -np 4 python recipes/06_horovod.py         # or srun / mpirun
"""
import os
from typing import Literal

import torch
import horovod.torch as hvd
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Subset

from dlscale.data import mini_cosmoflow  # (map, targets) pairs read from shard files
# the plumbing every stage shares, plain PyTorch in this folder: the device, logged losses and samples/s, checkpoints
from training_tools import (Progress, ProfilingWindow, from_launcher, load_checkpoint, marked, parse_args,
                            pick_device, save_checkpoint)


def make_model(width: int = 8, depth: int = 2, outputs: int = 3) -> nn.Sequential:
    """Blocks of two 3x3 convolutions (group norm, ReLU) and a 2x2 max-pool, then a small MLP head."""
    channels = [1] + [width * 2 ** i for i in range(depth)]
    layers = []
    for c_in, c_out in zip(channels, channels[1:]):
        for c in (c_in, c_out):
            layers += [nn.Conv2d(c, c_out, 3, padding=1, bias=False), nn.GroupNorm(max(1, c_out // 8), c_out), nn.ReLU()]
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(channels[-1], 2 * channels[-1]), nn.ReLU(), nn.Linear(2 * channels[-1], outputs))


@torch.no_grad()
def r2_score(model: nn.Module, loader: DataLoader, device: torch.device) -> float:
    """Validation R² over every rank's share: each rank's sums, added over the ranks, then the ratio."""
    model.eval()
    sums = 0
    for x, y in loader:
        y, pred = y.to(device).double(), model(x.to(device)).double()
        sums = sums + torch.stack([torch.ones_like(y).sum(0), y.sum(0), (y * y).sum(0), ((pred - y) ** 2).sum(0)])
    model.train()
    sums = hvd.allreduce(sums, op=hvd.Sum)  # (a mean of the ranks' R² would be wrong: R² is a ratio of sums)
    count, total, squares, errors = sums
    return float((1 - errors / (squares - total * total / count)).mean())


def main(config: str = "tiny", epochs: int = 2, batch_size: int = 32, lr: float = 2e-3, weight_decay: float = 1e-4,
         seed: int = 0, device: str = "auto", width: int = 8, depth: int = 2,
         checkpoint: str = "checkpoint.pt", resume: bool = False, log_every: int = 10,
         workers: int = 2, precision: Literal["bf16", "fp16", "fp32"] = "bf16",
         clip: float = 1.0, compile: bool = True, profile_steps: str = "",
         accumulate: int = 1) -> dict:
    hvd.init()  # 1: join the job (horovodrun, srun or mpirun started the processes)
    rank, world_size, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
    # srun or mpiexec start tasks that a Horovod built without MPI (the gloo build of scripts/build_horovod.sh)
    # cannot join: each would train alone as rank 0 of 1, all on one GPU, overwriting one checkpoint
    launched = from_launcher("SLURM_NTASKS", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", default=world_size)
    if "HOROVOD_SIZE" not in os.environ and launched != world_size:
        raise SystemExit(f"Horovod sees {world_size} rank(s), but the launcher started {launched} tasks: this Horovod "
                         f"cannot join tasks it did not start. Start the job with horovodrun -np {launched}")
    if batch_size % (world_size * accumulate):
        raise SystemExit(f"--batch-size {batch_size} is the global batch: it must split evenly over {world_size} "
                         f"ranks x {accumulate} micro-batches")
    device = pick_device(device, local_rank)  # 2: one GPU per process
    torch.manual_seed(seed)
    if rank != 0:  # rank 0 writes the data set on a first run, once; the others wait, then read it
        hvd.allreduce(torch.zeros(1), name="data written")
    train_set, val_set = mini_cosmoflow(config)
    if rank == 0:
        hvd.allreduce(torch.zeros(1), name="data written")
    # 3: each rank a disjoint share: the sampler shuffles as stage 01 did (a permutation seeded by seed + epoch)
    # and takes every world_size-th index from `rank`; drop_last gives every rank the same number of steps
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=seed, drop_last=True)
    # Workers read and decode the next batches while the model trains on this one; pinned (page-locked)
    # host memory lets the copy to the GPU run asynchronously (non_blocking below).
    loading = dict(num_workers=workers, pin_memory=device.type == "cuda")
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)), batch_size=batch_size, **loading)
    # (the default layout: Horovod reduces contiguous tensors only, which channels-last weights are not)
    model = make_model(width, depth).to(device)
    step_model = torch.compile(model) if compile else model
    # weights decay; biases and norm scales do not (decaying them regularizes nothing)
    groups = [{"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": weight_decay},
              {"params": [p for p in model.parameters() if p.ndim <= 1], "weight_decay": 0.0}]
    # 4: the optimizer all-reduces (averages) each gradient as soon as the backward pass has produced it, after
    # `accumulate` backward passes
    optimizer = hvd.DistributedOptimizer(torch.optim.AdamW(groups, lr=lr), named_parameters=model.named_parameters(),
                                         op=hvd.Average, backward_passes_per_step=accumulate)
    loss_fn = nn.MSELoss()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]
    # fp16 keeps 5 exponent bits: small gradients underflow to 0 unless the loss is scaled up first.
    # bf16 has fp32's range and needs no scaler; disabled, the scaler's calls pass straight through.
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    run = dict(config=config, batch_size=batch_size, lr=lr, weight_decay=weight_decay, seed=seed, width=width)
    state = load_checkpoint(checkpoint, run, device) if resume else None
    if state:  # the weights, the optimizer's moments, and the epoch to go on from
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
    # 5: every rank starts from rank 0's weights (resuming, every rank has read the same checkpoint)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    average = lambda block: hvd.allreduce(block, op=hvd.Average)  # noqa: E731  (the ranks' mean, once per block)
    progress, r2, window = Progress(log_every, batch_size, average), [], ProfilingWindow(profile_steps)
    for epoch in range(state["epoch"] if state else 0, epochs):
        sampler.set_epoch(epoch)  # a new order every epoch (without it every epoch repeats the first one's)
        progress.begin()
        for x, y in DataLoader(train_set, batch_size=batch_size // world_size, sampler=sampler, drop_last=True,
                               **loading):
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = 0
            for i, (xs, ys) in enumerate(zip(x.chunk(accumulate), y.chunk(accumulate))):
                # each micro-batch's gradients add up in .grad; Horovod all-reduces after the last one's backward
                with marked("forward"), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    micro_loss = loss_fn(step_model(xs), ys) / accumulate  # dtype's matmuls, an fp32 loss
                with marked("backward"):
                    scaler.scale(micro_loss).backward()
                loss = loss + micro_loss.detach()
            optimizer.synchronize()  # wait for the all-reduces before reading the gradients
            scaler.unscale_(optimizer)  # the true gradients, before clipping compares them with `clip`
            nn.utils.clip_grad_norm_(model.parameters(), clip)
            with marked("optimizer step"):
                with optimizer.skip_synchronize():  # (already waited)
                    scaler.step(optimizer)  # skipped when a gradient overflowed (and the scale is lowered)
            scaler.update()
            progress.step(loss)
            window.step()
        progress.step()
        r2.append(r2_score(model, val_loader, device))
        if rank == 0:  # the ranks hold the same weights: one writes, the others would only race it
            save_checkpoint({"run": run, "epoch": epoch + 1, "model": model.state_dict(),
                             "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()}, checkpoint)
            print(f"epoch {epoch + 1}: training loss {progress.losses[-1]:.4f}, validation R² {r2[-1]:.4f}")
    return {"losses": progress.losses, "r2": r2, "throughput": progress.throughput}


if __name__ == "__main__":
    main(**parse_args(main))
