# recipes/10_fsdp_tp.py: written from notebooks/10_sharded_and_model_parallel.ipynb by `dlscale recipes`; edit the lesson's cell
"""A plain PyTorch training loop for the mini-CosmoFlow maps: stage 10 of the recipe (lesson 10).

Copy it, with training_tools.py beside it, into your own project: only the data set comes from dlscale
(any Dataset of (input, target) pairs will do). Each stage logs the loss and samples/s per block of
steps and resumes from its checkpoint; each later stage adds one capability (`diff` two stages).
Stage 02 reads the batches in worker processes, into pinned memory on a GPU. Stage 03 runs the
forward pass in bf16 or fp16 (with loss scaling) and clips the gradient norm. Stage 04 keeps the
maps in the channels-last layout and compiles the model. Stage 05 trains on every GPU of the job,
one process each, with DistributedDataParallel:

    torchrun --standalone --nproc-per-node 4 recipes/05_ddp.py   # one node
    srun python recipes/05_ddp.py                                # a Slurm job (recipes/09_job.sbatch)

Stage 10 trains a transformer too large to copy onto every GPU. It is built on the meta device (no
memory), split, and only then does each rank allocate and initialize its own shards. FSDP2
(fully_shard) keeps a shard of each block's parameters, gradients and optimizer state per rank;
tensor parallelism (--tp 2) splits each block's matrices over ranks on a 2-D mesh;
torch.distributed.checkpoint saves and loads the shards in parallel, one folder per epoch.
Compared with stage 05 it drops compile, channels-last, autocast, the scaler and the profiling window
(FSDP2's MixedPrecisionPolicy does the casting; fp16 would need a sharded scaler).

    torchrun --standalone --nproc-per-node 4 recipes/10_fsdp_tp.py --tp 2 --resume
"""
import datetime
import os
import shutil
import time
from typing import Literal

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, DistributedSampler, Subset

from dlscale.data import mini_cosmoflow  # (map, targets) pairs read from shard files
from dlscale.models import ViTRegressor  # lesson 10's transformer: yours goes here (its blocks are the unit)
# the plumbing every stage shares, plain PyTorch in this folder: the device, logged losses and samples/s
from training_tools import Progress, from_launcher, parse_args, pick_device


@torch.no_grad()
def r2_score(model: nn.Module, loader: DataLoader, device: torch.device) -> float:
    """Validation R² over every rank's share: each rank's sums, added over the ranks, then the ratio. Every rank
    runs as many batches as the rank with most (FSDP gathers each block's weights from all of them): a rank
    whose share has run out repeats its first batch with a weight of 0."""
    model.eval()
    batches = torch.tensor(len(loader), device=device)
    dist.all_reduce(batches, op=dist.ReduceOp.MAX)
    sums, rows, first = 0, iter(loader), None
    for _ in range(int(batches)):
        batch = next(rows, None)
        first = first or batch
        x, y = batch or first  # once this rank's share has run out: its first batch again, with a weight of 0
        weight = 0.0 if batch is None else 1.0
        y, pred = y.to(device).double(), model(x.to(device)).double()
        sums = sums + weight * torch.stack([torch.ones_like(y).sum(0), y.sum(0), (y * y).sum(0), ((pred - y) ** 2).sum(0)])
    model.train()
    dist.all_reduce(sums)  # (a mean of the ranks' R² would be wrong: R² is a ratio of sums)
    count, total, squares, errors = sums
    return float((1 - errors / (squares - total * total / count)).mean())


def clip_gradients(model: nn.Module, clip: float) -> None:
    """Scale the gradients so that their whole norm is at most `clip`. Each rank has the norms of its shards; the
    squares of those split along a mesh dimension are added over it: one all-reduce per mesh dimension."""
    grads = [p.grad for p in model.parameters()]
    norms, groups = torch.stack([g.to_local().norm() for g in grads]).float(), {}
    for i, g in enumerate(grads):  # (FSDP over a tp shard is a _StridedShard: not is_replicate(), not is_shard())
        dims = tuple(d for d, place in enumerate(g.placements) if not place.is_replicate())
        groups.setdefault((id(g.device_mesh), dims), (g.device_mesh, dims, []))[2].append(i)
    for mesh, dims, index in groups.values():
        squares = norms[index] ** 2
        for dim in dims:
            dist.all_reduce(squares, group=mesh.get_group(dim))
        norms[index] = squares.sqrt()
    nn.utils.clip_grads_with_norm_(model.parameters(), clip, torch.linalg.vector_norm(norms), foreach=False)


def latest_checkpoint(folder: str) -> str | None:
    """The newest complete epoch folder (epoch-N): DCP writes its .metadata last, so a folder without it was cut."""
    done = [n for n in os.listdir(folder) if os.path.exists(os.path.join(folder, n, ".metadata"))] \
        if os.path.isdir(folder) else []
    return os.path.join(folder, max(done, key=lambda n: int(n.split("-")[1]))) if done else None


def main(config: str = "tiny", epochs: int = 2, batch_size: int = 32, lr: float = 2e-3, weight_decay: float = 1e-4,
         seed: int = 0, device: str = "auto", width: int = 32,
         depth: int = 2, heads: int = 4, checkpoint: str = "checkpoint-dcp", resume: bool = False,
         log_every: int = 10, workers: int = 2, precision: Literal["bf16", "fp32"] = "bf16", clip: float = 1.0,
         accumulate: int = 1, tp: int = 1) -> dict:
    # the launcher numbers the processes: torchrun (RANK...), srun (SLURM_PROCID...), mpiexec on Polaris (PMI_RANK...)
    rank = from_launcher("RANK", "SLURM_PROCID", "PMI_RANK")
    world_size = from_launcher("WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE", default=1)
    local_rank = from_launcher("LOCAL_RANK", "SLURM_LOCALID", "PMI_LOCAL_RANK")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # (a job script sets both for several nodes)
    os.environ.setdefault("MASTER_PORT", "29500")
    data_ranks = world_size // tp
    if world_size % tp or heads % tp or batch_size % (data_ranks * accumulate):
        raise SystemExit(f"--tp {tp} must divide the {world_size} ranks and the {heads} heads, and --batch-size "
                         f"{batch_size} split evenly over {data_ranks} data ranks x {accumulate} micro-batches")
    device = pick_device(device, local_rank)  # one GPU per process
    # a rank waits at most 5 minutes for the others to join, and later for each collective: a peer that never
    # started, or died, ends the job with an error naming the timeout, not a hang until the time limit
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=5), device_id=device if device.type == "cuda" else None)
    if rank != 0:  # rank 0 writes the data set on a first run, once; the others wait, then read it
        dist.barrier()
    train_set, val_set = mini_cosmoflow(config)
    if rank == 0:
        dist.barrier()
    # ranks in a grid of (data parallel) x (tensor parallel); the tp ranks of a row read the same samples
    mesh = init_device_mesh(device.type, (data_ranks, tp), mesh_dim_names=("dp", "tp"))
    data_rank = mesh["dp"].get_local_rank()
    sampler = DistributedSampler(train_set, num_replicas=data_ranks, rank=data_rank, seed=seed, drop_last=True)
    # Workers read and decode the next batches while the model trains on this one; pinned (page-locked)
    # host memory lets the copy to the GPU run asynchronously (non_blocking below).
    loading = dict(num_workers=workers, pin_memory=device.type == "cuda")
    val_loader = DataLoader(Subset(val_set, range(data_rank, len(val_set), data_ranks)), batch_size=batch_size,
                            **loading)
    with torch.device("meta"):  # the model's shapes only: no memory, no values yet
        model = ViTRegressor(image_size=train_set.input_shape[-1], width=width, depth=depth, heads=heads)
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
    model.to_empty(device=device)  # this rank's shards only, allocated on its device
    model.init_weights(seed)  # each parameter's values from the seed; every rank keeps its shard of them
    # weights decay; biases and norm scales do not (decaying them regularizes nothing)
    groups = [{"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": weight_decay},
              {"params": [p for p in model.parameters() if p.ndim <= 1], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr)
    loss_fn = nn.MSELoss()
    first_epoch, found = 0, latest_checkpoint(checkpoint) if resume else None
    if found:  # every rank reads its own shards, in parallel
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state, "epoch": 0}
        dcp.load(state, checkpoint_id=found)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        first_epoch = state["epoch"]
    progress, r2 = Progress(log_every, batch_size), []
    for epoch in range(first_epoch, epochs):
        sampler.set_epoch(epoch)  # a new order every epoch (without it every epoch repeats the first one's)
        progress.begin()
        for x, y in DataLoader(train_set, batch_size=batch_size // data_ranks, sampler=sampler, drop_last=True,
                               **loading):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = 0
            for i, (xs, ys) in enumerate(zip(x.chunk(accumulate), y.chunk(accumulate))):
                # each micro-batch's gradients add up; FSDP reduce-scatters them only in the last one's backward
                model.set_requires_gradient_sync(i == accumulate - 1)
                micro_loss = loss_fn(model(xs), ys) / accumulate
                micro_loss.backward()
                loss = loss + micro_loss.detach()
            clip_gradients(model, clip)
            optimizer.step()  # each rank updates its own shards
            progress.step(loss)  # (averaged over all ranks: a row's tp ranks hold the same loss)
        progress.step()
        r2.append(r2_score(model, val_loader, device))
        # a new folder per epoch: every rank writes its own shards (no rank holds the whole model), rank 0 the
        # metadata last; a crash mid-write leaves the previous epoch's folder whole
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state, "epoch": epoch + 1},
                 checkpoint_id=os.path.join(checkpoint, f"epoch-{epoch + 1}"))
        if rank == 0:
            shutil.rmtree(os.path.join(checkpoint, f"epoch-{epoch - 1}"), ignore_errors=True)  # keep the last two
            print(f"epoch {epoch + 1}: training loss {progress.losses[-1]:.4f}, validation R² {r2[-1]:.4f}")
    # every rank done with its collectives before any leaves; then a moment without the GIL, in which gloo
    # frees the barrier's buffers (destroyed at once, a rank can hang in the group's destructor)
    dist.barrier()
    time.sleep(0.1)
    dist.destroy_process_group()
    return {"losses": progress.losses, "r2": r2, "throughput": progress.throughput}


if __name__ == "__main__":
    main(**parse_args(main))
