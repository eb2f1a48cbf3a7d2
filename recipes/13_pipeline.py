# recipes/13_pipeline.py: written from notebooks/13_pipeline_parallel.ipynb by `dlscale recipes`; edit the lesson's cell
"""A plain PyTorch training loop for the mini-CosmoFlow maps: stage 13 of the recipe (lesson 13).

Copy it, with training_tools.py beside it, into your own project: only the data set comes from dlscale
(any Dataset of (input, target) pairs will do). Each stage logs the loss and samples/s per block of
steps and resumes from its checkpoint; each later stage adds one capability (`diff` two stages).
Stage 10 trains a transformer too large for one GPU by sharding it: each rank holds a slice of every
block (FSDP) or of every matrix (tensor parallelism), built on the meta device and saved with DCP.

Stage 13 cuts it the third way, into a pipeline: each rank holds a run of consecutive blocks (the
first also the embedding, the last the head and the loss) and hands a micro-batch's activations to the
next rank, and its gradient back, with torch.distributed.pipelining. Each step's batch is cut into
--microbatches; --schedule orders their forwards and backwards (gpipe: all forwards, then all backwards;
1f1b: one forward, one backward, so fewer activations are held; interleaved-1f1b: --stages-per-rank
stages on each rank, so the pipeline fills sooner). Inside a stage, --tp ranks split each block's matrices as in
stage 10: on a cluster the tp ranks sit inside a node and the pipeline crosses nodes
(recipes/jobs/: STAGE=13_pipeline.py). Compared with stage 10 it leaves out FSDP (every rank of a
stage reads the same batches: no data parallelism) and mixed precision.

    torchrun --standalone --nproc-per-node 4 recipes/13_pipeline.py --schedule 1f1b --microbatches 8
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
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, DistributedSampler

from dlscale.data import mini_cosmoflow  # (map, targets) pairs read from shard files
from dlscale.models import ViTRegressor  # lesson 10's transformer: yours goes here (a run of its blocks is a stage)
# the plumbing every stage shares, plain PyTorch in this folder: the device, logged losses and samples/s
from training_tools import Progress, ProfilingWindow, from_launcher, marked, parse_args, pick_device


@torch.no_grad()
def r2_score(schedule, loader: DataLoader, batch_size: int, ends: tuple[bool, bool], last_rank: int, group,
             device: torch.device) -> float:
    """Validation R², forward only through the pipeline: the last stage adds up its sums, every rank gets them.
    The stages learned their tensors' shapes at the first step, so a short last batch is padded with zeros
    (their predictions dropped); the schedule computes a loss on the last stage also here: given zero targets."""
    first, last = ends
    sums = torch.zeros(4, 3, dtype=torch.float64, device=device)
    for x, y in loader:
        count, x = len(x), x.to(device)
        x = torch.cat([x, x.new_zeros((batch_size - count, *x.shape[1:]))])
        zeros = torch.zeros((batch_size, *y.shape[1:]), device=device) if last else None
        pred = schedule.eval(*([x] if first else []), target=zeros)
        if last:
            y, pred = y.to(device).double(), pred[:count].double()
            sums += torch.stack([torch.ones_like(y).sum(0), y.sum(0), (y * y).sum(0), ((pred - y) ** 2).sum(0)])
    dist.broadcast(sums, src=last_rank, group=group)  # (the other stages never see a prediction)
    count, total, squares, errors = sums
    return float((1 - errors / (squares - total * total / count)).mean())


def clip_gradients(model: nn.Module, clip: float, group) -> None:
    """Scale the gradients so that their whole norm, over every stage, is at most `clip`: each rank adds the squares
    of its own parameters' gradients (the whole of a tp-split one: added over the tp ranks it is split on), then
    the stages' sums are added over the pipeline's ranks."""
    grads = [p.grad for p in model.parameters()]
    squares = torch.zeros((), dtype=torch.float32, device=grads[0].device)
    for g in grads:
        part = g.to_local().float().pow(2).sum() if hasattr(g, "to_local") else g.float().pow(2).sum()
        for dim, place in enumerate(getattr(g, "placements", ())):
            if not place.is_replicate():
                dist.all_reduce(part, group=g.device_mesh.get_group(dim))
        squares = squares + part
    dist.all_reduce(squares, group=group)
    nn.utils.clip_grads_with_norm_(model.parameters(), clip, squares.sqrt(), foreach=False)


def latest_checkpoint(folder: str) -> str | None:
    """The newest complete epoch folder (epoch-N): DCP writes its .metadata last, so a folder without it was cut."""
    done = [n for n in os.listdir(folder) if os.path.exists(os.path.join(folder, n, ".metadata"))] \
        if os.path.isdir(folder) else []
    return os.path.join(folder, max(done, key=lambda n: int(n.split("-")[1]))) if done else None


def main(config: str = "tiny", epochs: int = 2, batch_size: int = 32, lr: float = 2e-3, weight_decay: float = 1e-4,
         seed: int = 0, device: str = "auto", width: int = 32, depth: int = 4, heads: int = 4,
         checkpoint: str = "checkpoint-pp", resume: bool = False, log_every: int = 10, workers: int = 2,
         clip: float = 1.0, tp: int = 1, schedule: Literal["gpipe", "1f1b", "interleaved-1f1b"] = "1f1b",
         microbatches: int = 4, stages_per_rank: int = 1, profile_steps: str = "") -> dict:
    # the launcher numbers the processes: torchrun (RANK...), srun (SLURM_PROCID...), mpiexec on Polaris (PMI_RANK...)
    rank = from_launcher("RANK", "SLURM_PROCID", "PMI_RANK")
    world_size = from_launcher("WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE", default=1)
    local_rank = from_launcher("LOCAL_RANK", "SLURM_LOCALID", "PMI_LOCAL_RANK")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # (a job script sets both for several nodes)
    os.environ.setdefault("MASTER_PORT", "29500")
    pp = world_size // tp  # the pipeline's stages: the ranks that are not splitting a stage's matrices
    per_rank = stages_per_rank if schedule == "interleaved-1f1b" else 1  # (the others run one)
    if world_size % tp or heads % tp or depth < pp * per_rank or batch_size % microbatches \
            or (schedule == "1f1b" and microbatches < pp):
        raise SystemExit(f"--tp {tp} must divide the {world_size} ranks and the {heads} heads; --depth {depth} needs "
                         f"a block for each of the {pp} x {per_rank} stages; --microbatches {microbatches} must divide "
                         f"--batch-size {batch_size} (and, with 1f1b, be at least the {pp} stages)")
    device = pick_device(device, local_rank)  # one GPU per process
    # a rank waits at most 5 minutes for the others to join, and later for each send or collective: a peer that never
    # started, or died, ends the job with an error naming the timeout, not a hang until the time limit
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=5), device_id=device if device.type == "cuda" else None)
    if rank != 0:  # rank 0 writes the data set on a first run, once; the others wait, then read it
        dist.barrier()
    train_set, val_set = mini_cosmoflow(config)
    if rank == 0:
        dist.barrier()
    # ranks in a grid of (pipeline stages) x (tensor parallel): a stage's tp ranks consecutive (inside a node)
    mesh = init_device_mesh(device.type, (pp, tp), mesh_dim_names=("pp", "tp"))
    place, group = mesh["pp"].get_local_rank(), mesh["pp"].get_group()
    last_rank = dist.get_global_rank(group, pp - 1)  # this rank's pipeline's last stage: it computes the loss
    # every stage reads the same batches (the first needs the maps, the last the targets): one shuffled order
    sampler = DistributedSampler(train_set, num_replicas=1, rank=0, seed=seed, drop_last=True)
    loading = dict(num_workers=workers, pin_memory=device.type == "cuda")
    val_loader = DataLoader(val_set, batch_size=batch_size, **loading)
    with torch.device("meta"):  # the model's shapes only: no memory, no values yet
        model = ViTRegressor(image_size=train_set.input_shape[-1], width=width, depth=depth, heads=heads)
    total = pp * per_rank
    ids = [place + round_ * pp for round_ in range(per_rank)]  # this rank's stages: r, r + pp, ... (round-robin)
    runs = torch.arange(depth).tensor_split(total)  # consecutive blocks per stage, as even as they divide
    parts = [model.pipeline_stage(runs[i].tolist(), first=i == 0, last=i == total - 1) for i in ids]
    for part in parts:
        if tp > 1:  # each block's matrices split over the tp ranks: whole heads and a share of the MLP each
            split = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                     "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
                     "mlp.w1": ColwiseParallel(), "mlp.w2": RowwiseParallel()}
            for block in part.blocks.values():
                parallelize_module(block, mesh["tp"], split)
        part.to_empty(device=device)  # this rank's stages only, allocated on its device
        part.init_weights(seed)  # the values the whole model would give these layers
    loss_fn = nn.MSELoss()
    # each stage sends its output to the next rank of the pipeline and receives its input gradient back
    stages = [PipelineStage(part, i, total, device, group=group) for part, i in zip(parts, ids)]
    if schedule == "interleaved-1f1b":  # each rank's stages take turns
        runner = ScheduleInterleaved1F1B(stages, n_microbatches=microbatches, loss_fn=loss_fn)
    else:  # one stage per rank
        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
        runner = kind(stages[0], n_microbatches=microbatches, loss_fn=loss_fn)
    ends = (any(stage.is_first for stage in stages), any(stage.is_last for stage in stages))
    held = parts[0].together(parts)  # this rank's layers as one module (for the optimizer and the checkpoint)
    # weights decay; biases and norm scales do not (decaying them regularizes nothing)
    groups = [{"params": [p for p in held.parameters() if p.ndim > 1], "weight_decay": weight_decay},
              {"params": [p for p in held.parameters() if p.ndim <= 1], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr)
    first_epoch, found = 0, latest_checkpoint(checkpoint) if resume else None
    # the optimizer's settings kept per parameter (flattened): the stages hold different parameters, and DCP would
    # keep one rank's list of param_groups for every rank
    flat = StateDictOptions(flatten_optimizer_state_dict=True)
    if found:  # every rank reads its own stages' tensors, in parallel
        model_state, optimizer_state = get_state_dict(held, optimizer, options=flat)
        state = {"model": model_state, "optimizer": optimizer_state, "epoch": 0}
        dcp.load(state, checkpoint_id=found)
        set_state_dict(held, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=flat)
        first_epoch = state["epoch"]
    progress, r2, window = Progress(log_every, batch_size), [], ProfilingWindow(profile_steps)
    for epoch in range(first_epoch, epochs):
        sampler.set_epoch(epoch)  # a new order every epoch (without it every epoch repeats the first one's)
        progress.begin()
        for x, y in DataLoader(train_set, batch_size=batch_size, sampler=sampler, drop_last=True, **loading):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad()
            # the batch cut into micro-batches: the first stage feeds the maps, the last compares with the targets
            # and keeps each micro-batch's loss; the schedule averages the gradients over the micro-batches
            losses = []
            with marked("pipeline step"):
                runner.step(*([x] if ends[0] else []), target=y if ends[1] else None, losses=losses)
            loss = torch.stack(losses).mean().detach() if losses else torch.zeros((), device=device)
            dist.broadcast(loss, src=last_rank, group=group)  # every rank logs the last stage's loss
            clip_gradients(held, clip, group)
            with marked("optimizer step"):
                optimizer.step()  # each rank updates its own stages' layers
            progress.step(loss)
            window.step()
        progress.step()
        r2.append(r2_score(runner, val_loader, batch_size, ends, last_rank, group, device))
        # a new folder per epoch: every rank writes its own stages' tensors, rank 0 the metadata last; a crash
        # mid-write leaves the previous epoch's folder whole
        model_state, optimizer_state = get_state_dict(held, optimizer, options=flat)
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
