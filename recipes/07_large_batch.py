# recipes/07_large_batch.py: written from notebooks/07_large_batch.ipynb by `dlscale recipes`; edit the lesson's cell
"""A plain PyTorch training loop for the mini-CosmoFlow maps: stage 07 of the recipe (lesson 07).

Copy it, with training_tools.py beside it, into your own project: only the data set comes from dlscale
(any Dataset of (input, target) pairs will do). Each stage logs the loss and samples/s per block of
steps and resumes from its checkpoint; each later stage adds one capability (`diff` two stages).
Stage 02 reads the batches in worker processes, into pinned memory on a GPU. Stage 03 runs the
forward pass in bf16 or fp16 (with loss scaling) and clips the gradient norm. Stage 04 names the
forward, backward and optimizer step for the profilers, records a window of steps, and compiles.
Stage 05 trains on every GPU of the job, one process each, with DistributedDataParallel, and can
accumulate gradients over micro-batches. Stage 07 scales the learning rate with the global batch,
warms it up, and offers the layer-wise LAMB and LARS (one more import from dlscale):

    torchrun --standalone --nproc-per-node 4 recipes/05_ddp.py   # one node
    torchrun --standalone --nproc-per-node 4 recipes/07_large_batch.py --batch-size 256 --optimizer-name lamb
"""
import contextlib
import datetime
import math
import os
import time
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, DistributedSampler, Subset

from dlscale.data import mini_cosmoflow  # (map, targets) pairs read from shard files
from dlscale.optim import LAMB, LARS  # layer-wise optimizers, correct on sharded parameters too
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
    dist.all_reduce(sums)  # (a mean of the ranks' R² would be wrong: R² is a ratio of sums)
    count, total, squares, errors = sums
    return float((1 - errors / (squares - total * total / count)).mean())


def main(config: str = "tiny", epochs: int = 2, batch_size: int = 32, lr: float = 2e-3, weight_decay: float = 1e-4,
         seed: int = 0, device: str = "auto", width: int = 8, depth: int = 2,
         checkpoint: str = "checkpoint.pt", resume: bool = False, log_every: int = 10,
         workers: int = 2, precision: Literal["bf16", "fp16", "fp32"] = "bf16",
         clip: float = 1.0, compile: bool = True, profile_steps: str = "",
         accumulate: int = 1, base_batch: int = 32, scaling: Literal["auto", "linear", "sqrt", "none"] = "auto",
         warmup_steps: int = 5, optimizer_name: Literal["adamw", "lamb", "sgd", "lars"] = "adamw") -> dict:
    # the launcher numbers the processes: torchrun (RANK...), srun (SLURM_PROCID...), mpiexec on Polaris (PMI_RANK...)
    rank = from_launcher("RANK", "SLURM_PROCID", "PMI_RANK")
    world_size = from_launcher("WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE", default=1)
    local_rank = from_launcher("LOCAL_RANK", "SLURM_LOCALID", "PMI_LOCAL_RANK")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # (a job script sets both for several nodes)
    os.environ.setdefault("MASTER_PORT", "29500")
    if batch_size % (world_size * accumulate):
        raise SystemExit(f"--batch-size {batch_size} is the global batch: it must split evenly over {world_size} "
                         f"ranks x {accumulate} micro-batches")
    device = pick_device(device, local_rank)  # one GPU per process
    # a rank waits at most 5 minutes for the others to join, and later for each collective: a peer that never
    # started, or died, ends the job with an error naming the timeout, not a hang until the time limit
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=5), device_id=device if device.type == "cuda" else None)
    torch.manual_seed(seed)  # the same initial weights on every rank (DDP also copies rank 0's)
    if rank != 0:  # rank 0 writes the data set on a first run, once; the others wait, then read it
        dist.barrier()
    train_set, val_set = mini_cosmoflow(config)
    if rank == 0:
        dist.barrier()
    # each rank a disjoint share: the sampler shuffles as stage 01 did (a permutation seeded by seed + epoch)
    # and takes every world_size-th index from `rank`; drop_last gives every rank the same number of steps
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=seed, drop_last=True)
    # Workers read and decode the next batches while the model trains on this one; pinned (page-locked)
    # host memory lets the copy to the GPU run asynchronously (non_blocking below).
    loading = dict(num_workers=workers, pin_memory=device.type == "cuda")
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)), batch_size=batch_size, **loading)
    # NHWC, the layout tensor cores read without transposing (the maps follow in the loop)
    model = make_model(width, depth).to(device, memory_format=torch.channels_last)
    # DDP all-reduces each bucket of gradients as soon as the backward pass has filled it; compiled after
    # wrapping, so that the compiled backward still lets each bucket's all-reduce start early
    ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    step_model = torch.compile(ddp_model) if compile else ddp_model
    # weights decay; biases and norm scales do not (decaying them regularizes nothing)
    groups = [{"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": weight_decay},
              {"params": [p for p in model.parameters() if p.ndim <= 1], "weight_decay": 0.0}]
    # lr was tuned at base_batch; a k times larger batch takes k times fewer steps, so each step goes further:
    # k times (linear: SGD, LARS) or sqrt(k) times (Adam-like: AdamW, LAMB), as lesson 07 measures
    if scaling == "auto":
        scaling = "sqrt" if optimizer_name in ("adamw", "lamb") else "linear"
    k = batch_size / base_batch
    peak_lr = lr * {"linear": k, "sqrt": math.sqrt(k), "none": 1.0}[scaling]
    make = {"adamw": torch.optim.AdamW, "lamb": LAMB, "sgd": lambda g, lr: torch.optim.SGD(g, lr=lr, momentum=0.9),
            "lars": lambda g, lr: LARS(g, lr=lr, momentum=0.9)}
    optimizer = make[optimizer_name](groups, lr=peak_lr)
    total_steps = epochs * (len(train_set) // world_size // (batch_size // world_size))
    start = lr / peak_lr if peak_lr > lr else 1.0 / max(1, warmup_steps)

    def lr_factor(step: int) -> float:
        """Linear warmup from lr (the unscaled one) to peak_lr, then a cosine down to 0 at the last step."""
        if step < warmup_steps:
            return start + (1 - start) * step / warmup_steps
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))))

    scheduler = LambdaLR(optimizer, lr_factor)  # the factor of peak_lr after each optimizer step
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
        scheduler.load_state_dict(state["scheduler"])
    progress, r2, window = Progress(log_every, batch_size), [], ProfilingWindow(profile_steps)
    for epoch in range(state["epoch"] if state else 0, epochs):
        sampler.set_epoch(epoch)  # a new order every epoch (without it every epoch repeats the first one's)
        progress.begin()
        for x, y in DataLoader(train_set, batch_size=batch_size // world_size, sampler=sampler, drop_last=True,
                               **loading):
            x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
            y = y.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = 0
            for i, (xs, ys) in enumerate(zip(x.chunk(accumulate), y.chunk(accumulate))):
                # each micro-batch's gradients add up in .grad; DDP all-reduces only in the last one's backward
                with ddp_model.no_sync() if i < accumulate - 1 else contextlib.nullcontext():
                    with marked("forward"), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                        micro_loss = loss_fn(step_model(xs), ys) / accumulate  # dtype's matmuls, an fp32 loss
                    with marked("backward"):
                        scaler.scale(micro_loss).backward()
                loss = loss + micro_loss.detach()
            scaler.unscale_(optimizer)  # the true gradients, before clipping compares them with `clip`
            nn.utils.clip_grad_norm_(model.parameters(), clip)
            with marked("optimizer step"):
                scaler.step(optimizer)  # skipped when a gradient overflowed (and the scale is lowered)
            scaler.update()
            scheduler.step()
            progress.step(loss)
            window.step()
        progress.step()
        r2.append(r2_score(model, val_loader, device))
        if rank == 0:  # the ranks hold the same weights: one writes, the others would only race it
            save_checkpoint({"run": run, "epoch": epoch + 1, "model": model.state_dict(),
                             "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                             "scheduler": scheduler.state_dict()}, checkpoint)
            print(f"epoch {epoch + 1}: training loss {progress.losses[-1]:.4f}, validation R² {r2[-1]:.4f}")
    # every rank done with its collectives before any leaves; then a moment without the GIL, in which gloo
    # frees the barrier's buffers (destroyed at once, a rank can hang in the group's destructor)
    dist.barrier()
    time.sleep(0.1)
    dist.destroy_process_group()
    return {"losses": progress.losses, "r2": r2, "throughput": progress.throughput}


if __name__ == "__main__":
    main(**parse_args(main))
