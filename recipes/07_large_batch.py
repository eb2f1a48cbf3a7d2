# recipes/07_large_batch.py
"""A plain PyTorch training loop for the mini-CosmoFlow maps: stage 07 of the recipe (lesson 07).

Copy it into your own project: only the data set comes from dlscale (any Dataset of (input,
target) pairs will do). Each later stage adds one capability; `diff` two stages to see it.
Stage 02 reads the batches in worker processes, into pinned memory on a GPU. Stage 03 runs the
forward pass in bf16 or fp16 (with loss scaling) and clips the gradient norm. Stage 04 keeps the
maps in the channels-last layout and compiles the model. Stage 05 trains on every GPU of the job,
one process each, with DistributedDataParallel:

    torchrun --standalone --nproc-per-node 4 recipes/05_ddp.py   # one node
    srun python recipes/05_ddp.py                                # a Slurm job (recipes/09_job.sbatch)

Stage 07 scales the learning rate with the global batch, warms it up, and offers the layer-wise
LAMB and LARS (the one more import from dlscale) for batches where AdamW and SGD fall behind.
"""
import argparse
import datetime
import math
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, DistributedSampler, Subset

from dlscale.data import mini_cosmoflow  # (map, targets) pairs read from shard files
from dlscale.optim import LAMB, LARS  # layer-wise optimizers, correct on sharded parameters too


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
def r2_score(model: nn.Module, loader: DataLoader, device: str) -> float:
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
         seed: int = 0, device: str = "cuda" if torch.cuda.is_available() else "cpu",
         checkpoint: str = "checkpoint.pt", workers: int = 2, precision: str = "bf16", clip: float = 1.0,
         compile: bool = True, base_batch: int = 32, scaling: str = "linear", warmup_steps: int = 5,
         optimizer_name: str = "adamw") -> dict:
    # torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; srun sets SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0)))
    world_size = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", 1)))
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", 0)))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # (the job script sets both for several nodes)
    os.environ.setdefault("MASTER_PORT", "29500")
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"  # one GPU per process
        torch.cuda.set_device(device)
    # a rank waits at most 5 minutes for the others to join, and later for each collective: a peer that never
    # started, or died, ends the job with an error naming the timeout, not a hang until the time limit
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=5))
    torch.manual_seed(seed)  # the same initial weights on every rank (DDP also copies rank 0's)
    train_set, val_set = mini_cosmoflow(config)
    # each rank a disjoint share: the sampler shuffles as stage 01 did (a permutation seeded by seed + epoch)
    # and takes every world_size-th index from `rank`; drop_last gives every rank the same number of steps
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=seed, drop_last=True)
    # Workers read and decode the next batches while the model trains on this one; pinned (page-locked)
    # host memory lets the copy to the GPU run asynchronously (non_blocking below).
    loading = dict(num_workers=workers, pin_memory=device.startswith("cuda"))
    train_loader = DataLoader(train_set, batch_size=batch_size // world_size, sampler=sampler, drop_last=True,
                              **loading)
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)), batch_size=batch_size, **loading)
    # NHWC, the layout tensor cores read without transposing (the maps follow in the loop)
    model = make_model().to(device, memory_format=torch.channels_last)
    # DDP all-reduces each bucket of gradients as soon as the backward pass has filled it; compiled after
    # wrapping, so that the compiled backward still lets each bucket's all-reduce start early
    ddp_model = DistributedDataParallel(model, device_ids=[local_rank] if device.startswith("cuda") else None)
    step_model = torch.compile(ddp_model) if compile else ddp_model
    # weights decay; biases and norm scales do not (decaying them regularizes nothing)
    groups = [{"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": weight_decay},
              {"params": [p for p in model.parameters() if p.ndim <= 1], "weight_decay": 0.0}]
    # lr was tuned at base_batch; a k times larger batch takes k times fewer steps, so each step goes further:
    # k times (linear, for SGD) or sqrt(k) times (for Adam-like optimizers at large k)
    k = batch_size / base_batch
    peak_lr = lr * {"linear": k, "sqrt": math.sqrt(k), "none": 1.0}[scaling]
    make = {"adamw": torch.optim.AdamW, "lamb": LAMB, "lars": lambda g, lr: LARS(g, lr=lr, momentum=0.9)}
    optimizer = make[optimizer_name](groups, lr=peak_lr)
    total_steps = epochs * len(train_loader)
    start = lr / peak_lr if peak_lr > lr else 1.0 / max(1, warmup_steps)

    def lr_factor(step: int) -> float:
        """Linear warmup from lr (the unscaled one) to peak_lr, then a cosine down to 0 at the last step."""
        if step < warmup_steps:
            return start + (1 - start) * step / warmup_steps
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))))

    scheduler = LambdaLR(optimizer, lr_factor)  # the factor of peak_lr after each optimizer step
    loss_fn = nn.MSELoss()
    device_type = torch.device(device).type
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]
    # fp16 keeps 5 exponent bits: small gradients underflow to 0 unless the loss is scaled up first.
    # bf16 has fp32's range and needs no scaler; disabled, the scaler's calls pass straight through.
    scaler = torch.amp.GradScaler(device_type, enabled=precision == "fp16")
    losses, r2 = [], []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # a new order every epoch (without it every epoch repeats the first one's)
        for x, y in train_loader:
            x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
            y = y.to(device, non_blocking=True)
            optimizer.zero_grad()
            with torch.autocast(device_type, dtype=dtype, enabled=dtype is not None):
                loss = loss_fn(step_model(x), y)  # matmuls and convolutions in dtype, the loss in fp32
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)  # the true gradients, before clipping compares them with `clip`
            nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(optimizer)  # skipped when a gradient overflowed (and the scale is lowered)
            scaler.update()
            scheduler.step()
            global_loss = loss.detach().clone()
            dist.all_reduce(global_loss)  # the mean over the ranks is the loss of the whole (global) batch
            losses.append(global_loss.item() / world_size)
        r2.append(r2_score(model, val_loader, device))
        if rank == 0:  # the ranks hold the same weights: one writes, the others would only race it
            torch.save({"epoch": epoch + 1, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scaler": scaler.state_dict(), "scheduler": scheduler.state_dict()}, checkpoint)
            print(f"epoch {epoch + 1}: training loss {losses[-1]:.4f}, validation R² {r2[-1]:.4f}")
    # every rank done with its collectives before any leaves; then a moment without the GIL, in which gloo
    # frees the barrier's buffers (destroyed at once, a rank can hang in the group's destructor)
    dist.barrier()
    time.sleep(0.1)
    dist.destroy_process_group()
    return {"losses": losses, "r2": r2}


def parse_args() -> dict:
    parser = argparse.ArgumentParser(description="Train the lesson's CNN in plain PyTorch.")
    parser.add_argument("--config", default="tiny", help="the data set's size: a dlscale config (tiny, demo)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="the global batch, over all ranks")
    parser.add_argument("--lr", type=float, default=2e-3, help="the learning rate tuned at --base-batch")
    parser.add_argument("--base-batch", type=int, default=32)
    parser.add_argument("--scaling", choices=["linear", "sqrt", "none"], default="linear")
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--optimizer", dest="optimizer_name", choices=["adamw", "lamb", "lars"], default="adamw")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes (0 = read in this one)")
    parser.add_argument("--precision", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--clip", type=float, default=1.0, help="the largest gradient norm")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    return vars(parser.parse_args())


if __name__ == "__main__":
    main(**parse_args())
