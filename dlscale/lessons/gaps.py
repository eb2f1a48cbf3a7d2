"""What each lesson leaves for the attendee to write in its stage of the recipe, and the hints for it.

A gap is a run of whole statements of the shipped stage (``recipes/NN_*.py``): from the first line that holds
``first`` to the next that holds ``last``. The lesson shows the stage with each gap replaced by a ``TODO`` that
says what must be true once it is written (``asks``: a behaviour, never the code; a test keeps the answer's API
names out of it). :func:`hint` helps one step at a time: the first call names what to use (``uses``), the second
shows our lines. The stage check (:mod:`dlscale.lessons.stage_probes`) names a gap by its label, ``TODO 05.c``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Gap:
    """One gap: where it is in the shipped stage, what it asks for, and what its answer uses."""

    first: str  # text of the gap's first line in the shipped stage
    last: str  # text of its last line (the first line at or after ``first`` that holds it)
    asks: str  # what must be true once it is written: the TODO's text
    uses: str  # the functions and classes the answer uses: the first hint


#: Every stage's gaps, in the order of its file; ``05_ddp.py``'s second gap is ``05.b``.
GAPS: dict[str, list[Gap]] = {
    "01_baseline.py": [
        Gap(
            "return float((1 - ((y - pred)",
            "return float((1 - ((y - pred)",
            "return the validation R² as one float: for each target, the share of its variance that the "
            "predictions explain (sums over the rows), then the mean over the targets",
            "1 - ((y - pred) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0), then .mean() and float(...)",
        ),
        Gap(
            "optimizer.zero_grad()",
            "optimizer.step()",
            "one training step on this batch: gradients of this batch alone (none left from the last one), "
            "then the weights moved against them",
            "optimizer.zero_grad(), loss_fn(model(x), y), loss.backward(), optimizer.step()",
        ),
    ],
    "02_data_loading.py": [
        Gap(
            "loading = dict(",
            "loading = dict(",
            "`loading`, the settings both loaders take: batches read by `workers` background processes, and "
            "held in page-locked host memory on a GPU only (on a CPU it only costs)",
            "dict(num_workers=..., pin_memory=...), the DataLoader's two arguments; device.type",
        ),
        Gap(
            "x, y = x.to(device, non_blocking=True)",
            "x, y = x.to(device, non_blocking=True)",
            "the batch on the training device, copied so that the host goes on while the copy runs",
            "tensor.to(device, non_blocking=True)",
        ),
    ],
    "03_mixed_precision.py": [
        Gap(
            "dtype = {",
            "scaler = torch.amp.GradScaler(",
            "`dtype`, the reduced precision that `precision` names (None for fp32), and `scaler`, a loss scaler "
            "for this device that acts for fp16 only (bf16 has fp32's range)",
            "torch.bfloat16, torch.float16; torch.amp.GradScaler(device.type, enabled=...)",
        ),
        Gap(
            "with torch.autocast(",
            "scaler.update()",
            "the step in that precision: forward and loss in `dtype` (in full precision for fp32), backward of "
            "the loss scaled up, the gradients clipped to `clip` at their true size, then the step and the "
            "scale's update (a step whose gradients overflowed is skipped)",
            "torch.autocast(device.type, dtype=..., enabled=...); scaler.scale(loss).backward(); "
            "scaler.unscale_(optimizer); nn.utils.clip_grad_norm_(...); scaler.step(optimizer); scaler.update()",
        ),
    ],
    "04_compile.py": [
        Gap(
            "step_model = torch.compile(",
            "step_model = torch.compile(",
            "`step_model`, the model the loop calls: turned into fused kernels by PyTorch 2's compiler when that "
            "switch is on, the plain model otherwise",
            "torch.compile(model)",
        ),
        Gap(
            'with marked("forward")',
            "window.step()",
            'stage 03\'s step, each of its phases a named range the profilers show ("forward" with the loss, '
            '"backward", "optimizer step"); then the loss logged and the profiling window told that a step '
            "ended",
            'with marked("forward"): ... (training_tools.marked); progress.step(loss); window.step()',
        ),
    ],
    "05_ddp.py": [
        Gap(
            "dist.all_reduce(sums)",
            "dist.all_reduce(sums)",
            "every rank's `sums` added together, in place, so that every rank computes the R² of the whole "
            "validation set",
            "dist.all_reduce(tensor) (a sum by default)",
        ),
        Gap(
            "dist.init_process_group(",
            "timedelta(minutes=5)",
            "this process joins the job's others: the backend for this device (GPU or CPU), as rank `rank` of "
            "`world_size`, and a peer that has not come (or dies) within 5 minutes ends the job with an error",
            'dist.init_process_group("nccl" or "gloo", rank=..., world_size=..., '
            "timeout=datetime.timedelta(minutes=5))",
        ),
        Gap(
            "sampler = DistributedSampler(",
            "sampler = DistributedSampler(",
            "`sampler`: each rank a different share of the training set, shuffled from `seed`, and every rank "
            "the same number of samples (the remainder left out)",
            "DistributedSampler(train_set, num_replicas=..., rank=..., seed=..., drop_last=True)",
        ),
        Gap(
            "ddp_model = DistributedDataParallel(",
            "ddp_model = DistributedDataParallel(",
            "`ddp_model`: the model, whose gradients are averaged over the ranks while the backward pass runs "
            "(on a GPU, it is told which device this rank uses)",
            "DistributedDataParallel(model, device_ids=[device.index] or None)",
        ),
        Gap(
            "sampler.set_epoch(epoch)",
            "sampler.set_epoch(epoch)",
            "a new order every epoch, the same one on every rank",
            "sampler.set_epoch(epoch)",
        ),
    ],
    "06_horovod.py": [
        Gap(
            "hvd.init()",
            "rank, world_size, local_rank = hvd.rank()",
            "this process joins Horovod's job; then `rank`, `world_size` and `local_rank` (its rank on the node) "
            "from Horovod",
            "hvd.init(); hvd.rank(), hvd.size(), hvd.local_rank()",
        ),
        Gap(
            "optimizer = hvd.DistributedOptimizer(",
            "op=hvd.Average, backward_passes_per_step",
            "`optimizer`: the earlier stages' optimizer over `groups` at `lr`, wrapped so that Horovod averages "
            "each gradient over the ranks (by name), once every `accumulate` backward passes",
            "hvd.DistributedOptimizer(torch.optim.AdamW(groups, lr=lr), named_parameters=..., op=hvd.Average, "
            "backward_passes_per_step=...)",
        ),
        Gap(
            "hvd.broadcast_parameters(",
            "hvd.broadcast_parameters(",
            "every rank starts from the same weights: rank 0's",
            "hvd.broadcast_parameters(model.state_dict(), root_rank=0)",
        ),
    ],
    "07_large_batch.py": [
        Gap(
            "peak_lr = lr * {",
            "peak_lr = lr * {",
            "`peak_lr`: `lr` was tuned at `base_batch`; for a batch k = batch_size / base_batch times larger, "
            "scale it by the rule `scaling` names: by k, by the square root of k, or not at all",
            'lr * {"linear": k, "sqrt": math.sqrt(k), "none": 1.0}[scaling]',
        ),
        Gap(
            "if step < warmup_steps:",
            "return 0.5 * (1 + math.cos(",
            "the factor of peak_lr at `step`: a straight line from `start` up to 1 over the warmup steps, then "
            "half a cosine down to 0 at the last step",
            "start + (1 - start) * step / warmup_steps; 0.5 * (1 + math.cos(math.pi * progress))",
        ),
        Gap(
            "scheduler.step()",
            "scheduler.step()",
            "the learning rate moves along the schedule: one step of it after every optimizer step",
            "scheduler.step()",
        ),
    ],
    "10_fsdp_tp.py": [
        Gap(
            'with torch.device("meta"):',
            "model = ViTRegressor(",
            "`model`: lesson 10's transformer for these maps, with its shapes but no memory and no values yet",
            'with torch.device("meta"): ViTRegressor(image_size=..., width=..., depth=..., heads=...)',
        ),
        Gap(
            "if tp > 1:",
            "parallelize_module(block",
            'with tp > 1, each block\'s matrices split over the tensor-parallel ranks (mesh["tp"]): the query, '
            "key and value projections and the MLP's first layer by their outputs, the attention's output and "
            "the MLP's second layer by their inputs",
            'parallelize_module(block, mesh["tp"], {"attention.wq": ColwiseParallel(), ..., '
            '"mlp.w2": RowwiseParallel()})',
        ),
        Gap(
            "for block in model.blocks:",
            "if bf16 else MixedPrecisionPolicy())",
            'each block sharded over the data-parallel ranks (mesh["dp"]) as a unit of its own, then the whole '
            "model; under bf16 the parameters and compute in bf16, the gradients reduced in fp32 and the output "
            "in fp32",
            "fully_shard(module, mesh=..., mp_policy=MixedPrecisionPolicy(**bf16, output_dtype=torch.float32))",
        ),
        Gap(
            "model.to_empty(",
            "model.init_weights(seed)",
            "this rank's shards get memory on the device, then their values from the seed",
            "model.to_empty(device=device); model.init_weights(seed)",
        ),
        Gap(
            "dcp.save(",
            "checkpoint_id=os.path.join(",
            "a sharded checkpoint of the model, the optimizer and the next epoch's number, in a folder of its "
            "own per epoch (`epoch-N` in `checkpoint`), every rank writing its own shards",
            'dcp.save({...}, checkpoint_id=os.path.join(checkpoint, f"epoch-{epoch + 1}")), with '
            "get_state_dict(model, optimizer)",
        ),
    ],
}


def gap_ids(stage: str) -> list[str]:
    """``["05.a", "05.b", ...]`` for ``stage`` (``"05_ddp.py"``)."""
    return [f"{stage[:2]}.{letter}" for letter, _ in zip("abcdefgh", GAPS[stage])]


def find_gap(gap_id: str) -> tuple[str, Gap]:
    """(the stage, the gap) of ``"05.c"``; a ``KeyError`` naming the lessons' gaps for another id."""
    for stage in GAPS:
        for found, gap in zip(gap_ids(stage), GAPS[stage]):
            if found == gap_id:
                return stage, gap
    raise KeyError(f"no gap {gap_id!r}: the gaps are {', '.join(i for s in GAPS for i in gap_ids(s))}")


def gap_span(lines: list[str], gap: Gap, start: int = 0) -> tuple[int, int] | None:
    """(first, last) line index of ``gap`` in ``lines`` at or after ``start``, or None."""
    begin = next((i for i in range(start, len(lines)) if gap.first in lines[i]), None)
    if begin is None:
        return None
    end = next((i for i in range(begin, len(lines)) if gap.last in lines[i]), None)
    return None if end is None else (begin, end)


def answer_lines(gap_id: str) -> str:
    """Our lines for a gap, as the shipped stage has them (its comments included)."""
    from dlscale.lessons.recipe_folder import recipe_path

    stage, _ = find_gap(gap_id)
    lines, start = recipe_path(stage).read_text().splitlines(), 0
    for found, gap in zip(gap_ids(stage), GAPS[stage]):
        span = gap_span(lines, gap, start)
        assert span is not None, f"recipes/{stage} lost gap {found}"
        if found == gap_id:
            block = lines[span[0] : span[1] + 1]
            indent = min(len(line) - len(line.lstrip()) for line in block if line.strip())
            return "\n".join(line[indent:] for line in block)
        start = span[1] + 1
    raise KeyError(gap_id)


_HINTS_GIVEN: dict[str, int] = {}


def hint(gap_id: str) -> None:
    """Help with one gap, one step at a time: the first call names what to use, the next shows our lines."""
    _, gap = find_gap(gap_id)
    given = _HINTS_GIVEN[gap_id] = _HINTS_GIVEN.get(gap_id, 0) + 1
    if given == 1:
        print(f"TODO {gap_id}: {gap.asks}\nUse: {gap.uses}\n(hint({gap_id!r}) again shows our lines)")
    else:
        print(f"TODO {gap_id}, our lines:\n{answer_lines(gap_id)}")


def api_names(code: str) -> set[str]:
    """The API names a piece of code calls that give an answer away: classes (CamelCase), functions with an
    underscore (``set_epoch``, ``clip_grad_norm_``), and ``compile`` and ``autocast``."""
    try:
        tree = ast.parse("if True:\n" + "".join(f"    {line}\n" for line in code.splitlines()))
    except SyntaxError:  # (a gap's lines cut from a longer statement)
        called = set(re.findall(r"(\w+)\(", code))
    else:
        called = {
            node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
        }
    return {
        name
        for name in called
        if "_" in name.strip("_") or re.match(r"[A-Z][a-z]+[A-Z]", name) or name in ("compile", "autocast")
    }
