# recipes/10_fsdp_tp.py
"""A plain PyTorch training loop for the mini-CosmoFlow maps: stage 10 of the recipe (lesson 10).

Copy it into your own project: only the data set comes from dlscale (any Dataset of (input,
target) pairs will do). Each later stage adds one capability; `diff` two stages to see it.
Stage 02 reads the batches in worker processes, into pinned memory on a GPU. Stage 03 runs the
forward pass in bf16 or fp16 (with loss scaling) and clips the gradient norm. Stage 04 keeps the
maps in the channels-last layout and compiles the model. Stage 05 trains on every GPU of the job,
one process each, with DistributedDataParallel:

    torchrun --standalone --nproc-per-node 4 recipes/05_ddp.py   # one node
    srun python recipes/05_ddp.py                                # a Slurm job (recipes/09_job.sbatch)

Stage 10 trains a transformer too large to copy onto every GPU: FSDP2 (fully_shard) keeps a shard of
each block's parameters, gradients and optimizer state per rank; tensor parallelism (--tp 2) splits
each block's matrices over ranks on a 2-D mesh; torch.distributed.checkpoint saves and loads the
shards in parallel. Compared with stage 05 it drops compile, channels-last, autocast and the scaler
(FSDP2's MixedPrecisionPolicy does the casting; fp16 would need a sharded scaler).

    torchrun --standalone --nproc-per-node 4 recipes/10_fsdp_tp.py --tp 2 --resume
"""
import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch import nn
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, DistributedSampler, Subset

from dlscale.data import mini_cosmoflow  # (map, targets) pairs read from shard files
from dlscale.models import ViTRegressor  # lesson 10's transformer: yours goes here (its blocks are the unit)


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
         checkpoint: str = "checkpoint-dcp", workers: int = 2, precision: str = "bf16", clip: float = 1.0,
         tp: int = 1, width: int = 32, depth: int = 2, heads: int = 4, resume: bool = False) -> dict:
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
    torch.manual_seed(seed)  # the same initial weights on every rank (each then keeps its shards)
    train_set, val_set = mini_cosmoflow(config)
    # ranks in a grid of (data parallel) x (tensor parallel); the tp ranks of a row read the same samples
    mesh = init_device_mesh(torch.device(device).type, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))
    data_rank, data_ranks = mesh["dp"].get_local_rank(), world_size // tp
    sampler = DistributedSampler(train_set, num_replicas=data_ranks, rank=data_rank, seed=seed, drop_last=True)
    # Workers read and decode the next batches while the model trains on this one; pinned (page-locked)
    # host memory lets the copy to the GPU run asynchronously (non_blocking below).
    loading = dict(num_workers=workers, pin_memory=device.startswith("cuda"))
    train_loader = DataLoader(train_set, batch_size=batch_size // data_ranks, sampler=sampler, drop_last=True,
                              **loading)
    val_loader = DataLoader(Subset(val_set, range(data_rank, len(val_set), data_ranks)), batch_size=batch_size,
                            **loading)
    model = ViTRegressor(image_size=train_set.input_shape[-1], width=width, depth=depth, heads=heads).to(device)
    if tp > 1:  # each block's matrices split over the tp ranks: whole heads and a share of the MLP each
        split = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                 "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
                 "mlp.w1": ColwiseParallel(), "mlp.w2": RowwiseParallel()}
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], split)
    # FSDP2: each block one unit, gathered whole just before its forward and backward and freed after;
    # bf16 parameters and compute, gradients reduced and shards kept in fp32; the output (so the loss) fp32
    bf16 = dict(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if precision == "bf16" else {}
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"], mp_policy=MixedPrecisionPolicy(**bf16))
    fully_shard(model, mesh=mesh["dp"], mp_policy=MixedPrecisionPolicy(**bf16, output_dtype=torch.float32)
                if bf16 else MixedPrecisionPolicy())
    # weights decay; biases and norm scales do not (decaying them regularizes nothing)
    groups = [{"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": weight_decay},
              {"params": [p for p in model.parameters() if p.ndim <= 1], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr)
    loss_fn = nn.MSELoss()
    losses, r2, first_epoch = [], [], 0
    if resume and os.path.isdir(checkpoint):  # every rank reads its own shards, in parallel
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state, "epoch": 0}
        dcp.load(state, checkpoint_id=checkpoint)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        first_epoch = state["epoch"]
    for epoch in range(first_epoch, epochs):
        sampler.set_epoch(epoch)  # a new order every epoch (without it every epoch repeats the first one's)
        for x, y in train_loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()  # FSDP reduce-scatters each block's gradients: every rank keeps its shard's
            # the norm of the whole gradient: each parameter's norm over its shards, then over the parameters
            # (clip_grad_norm_ would stack norms of two meshes under tensor parallelism: (dp, tp) and dp)
            total_norm = torch.stack([p.grad.norm().full_tensor() for p in model.parameters()]).norm()
            nn.utils.clip_grads_with_norm_(model.parameters(), clip, total_norm, foreach=False)
            optimizer.step()  # each rank updates its own shards
            global_loss = loss.detach().clone()
            dist.all_reduce(global_loss)  # the mean over the ranks is the loss of the whole (global) batch
            losses.append(global_loss.item() / world_size)
        r2.append(r2_score(model, val_loader, device))
        # every rank writes its own shards (no rank holds the whole model), then rank 0 the metadata
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state, "epoch": epoch + 1}, checkpoint_id=checkpoint)
        if rank == 0:
            print(f"epoch {epoch + 1}: training loss {losses[-1]:.4f}, validation R² {r2[-1]:.4f}")
    # every rank done with its collectives before any leaves; then a moment without the GIL, in which gloo
    # frees the barrier's buffers (destroyed at once, a rank can hang in the group's destructor)
    dist.barrier()
    time.sleep(0.1)
    dist.destroy_process_group()
    return {"losses": losses, "r2": r2}


def parse_args() -> dict:
    parser = argparse.ArgumentParser(description="Train the lesson's transformer in plain PyTorch, sharded.")
    parser.add_argument("--config", default="tiny", help="the data set's size: a dlscale config (tiny, demo)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="the global batch, over all ranks")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes (0 = read in this one)")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--clip", type=float, default=1.0, help="the largest gradient norm")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per block (divides heads)")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint's epoch")
    parser.add_argument("--checkpoint", default="checkpoint-dcp", help="a folder of shards")
    return vars(parser.parse_args())


if __name__ == "__main__":
    main(**parse_args())
