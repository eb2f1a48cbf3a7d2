"""Pipeline parallelism: the model cut into stages by blocks, a rank per stage, micro-batches flowing through them.

Each rank of a pipeline holds some consecutive blocks (:func:`stage_blocks`); the first stage also embeds the
maps, the last also holds the head and computes the loss. A step's batch is cut into ``pipeline_microbatches``
micro-batches; a stage sends each one's activations to the next stage and, going back, each one's input
gradient to the stage before. A *schedule* orders this work on every rank, and this module uses PyTorch's own
(``torch.distributed.pipelining``: its ``PipelineStage`` sends and receives, its schedules order):

- ``gpipe``: every micro-batch forward, then every one backward. Simple; a stage holds the activations of all
  ``m`` micro-batches at once;
- ``1f1b``: after a warm-up of ``p - 1 - stage`` forwards, one forward then one backward: the same idle time,
  but a stage holds at most ``p`` micro-batches' activations (it needs ``m >= p``);
- ``interleaved-1f1b``: each rank holds ``v`` stages (the model cut into ``p * v``, placed round-robin:
  rank ``r`` holds stages ``r, r + p, ...``), so a micro-batch visits every rank ``v`` times and the
  pipeline fills ``v`` times faster: the textbook idle share ``(p - 1) / (v * m + p - 1)`` against
  ``(p - 1) / (m + p - 1)`` (:func:`textbook_bubble`), for ``v`` times as many sends.

Inside a stage the model is split and sharded as a whole model is (tensor parallelism on its blocks, FSDP on the
data-parallel ranks; :func:`dlscale.distributed.parallelize.build_step_model` on each stage): the mesh is
(pipeline × data-parallel × tensor-parallel), tensor-parallel ranks consecutive (inside a node), the pipeline
outermost (its sends are the smallest messages: a micro-batch's activations, across nodes).

What the stages need from a model (the ViT gives both, :mod:`dlscale.models.vit`): ``pipeline_stage(blocks,
first, last)``, a module of those blocks whose parameters keep the whole model's names and whose
``init_weights(seed)`` draws the whole model's values, and ``together(stages)`` on its class, one module of a
rank's stages for the optimizer and the checkpoint. The names are what make a checkpoint written by the
stages load into any other layout (:mod:`dlscale.checkpoint.sharded`).

Gradients: each micro-batch's loss is the mean over its samples, and the schedule divides the gradients by
``m`` (its ``scale_grads``), so that a step's gradient is the whole batch's mean, as in one process. Lesson 10
(the pipeline and the 3-D mesh) uses it; :mod:`dlscale.bench.pipeline` measures its bubble.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from dlscale.config import ConfigError

#: The schedules a config may name (``pipeline_schedule``), in the order a lesson shows them.
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


def stage_blocks(blocks: int, stages: int) -> list[range]:
    """The blocks of each of ``stages`` stages: consecutive, as even as they divide, the earlier stages one more.

    >>> stage_blocks(5, 2)
    [range(0, 3), range(3, 5)]
    """
    if not 1 <= stages <= blocks:
        raise ConfigError(f"{blocks} block(s) cannot be cut into {stages} pipeline stages: each needs a block")
    size, extra = divmod(blocks, stages)
    starts = [index * size + min(index, extra) for index in range(stages + 1)]
    return [range(start, stop) for start, stop in zip(starts, starts[1:])]


def local_stage_ids(pipeline_rank: int, pipeline: int, virtual: int) -> list[int]:
    """The stages one rank of a pipeline holds: its own place, and every ``pipeline``-th after it (round-robin)."""
    return [pipeline_rank + round_ * pipeline for round_ in range(virtual)]


def textbook_bubble(pipeline: int, microbatches: int, virtual: int = 1) -> float:
    """The share of a step a stage idles, when every micro-batch's forward and backward take the same time
    everywhere and sends take none: ``(p - 1) / (v·m + p - 1)`` (GPipe, 1F1B: ``v = 1``)."""
    return (pipeline - 1) / (virtual * microbatches + pipeline - 1)


def pipeline_stages(model: nn.Module, pipeline: int, pipeline_rank: int, virtual: int = 1) -> list[nn.Module]:
    """This rank's stages of ``model`` (``virtual`` of them, of ``pipeline * virtual``), each a module of its blocks
    sharing ``model``'s layers: built on the meta device, they are then split, sharded and materialized one by one.
    """
    split, units = getattr(model, "pipeline_stage", None), getattr(model, "parallel_units", None)
    if not callable(split) or not callable(units):
        raise ConfigError(
            f"pipeline_parallel needs a model that can be cut into stages, as model=vit can; "
            f"{type(model).__name__} cannot (it has no pipeline_stage)"
        )
    total = pipeline * virtual
    blocks = stage_blocks(len(units()), total)
    return [split(blocks[i], i == 0, i == total - 1) for i in local_stage_ids(pipeline_rank, pipeline, virtual)]


def rank_part(stages: Sequence[nn.Module]) -> nn.Module:
    """The rank's stages as one module (for the optimizer, clipping, memory and the checkpoint), taken once they are
    sharded and materialized; the whole model's names, so that its state dict is a part of the whole one's."""
    together = getattr(type(stages[0]), "together", None)
    if together is None:
        if len(stages) > 1:
            raise ConfigError(f"{type(stages[0]).__name__} cannot join several stages (it has no together())")
        return stages[0]
    part = together(stages)
    part.pipeline_part = True  # (a checkpoint holds the other stages' weights too: checkpoint.formats allows them)
    return part


class Pipeline:
    """This rank's stages and the schedule that runs them: one step's forward and backward, or a forward alone.

    ``batch`` is the samples of one rank's step (cut into the schedule's micro-batches). Every rank of the
    pipeline calls :meth:`forward_backward` and :meth:`predict` together; the first stage reads the maps,
    the last the targets, and the last stage's results are sent to the others, so that every rank returns
    the same loss and predictions (the step log and validation then average over data-parallel ranks as
    without a pipeline).
    """

    def __init__(self, schedule: Any, stages: list[Any], group: Any, batch: int):
        import torch.distributed as dist

        self.schedule, self.stages, self.group, self.batch = schedule, stages, group, batch
        self.first = any(stage.is_first for stage in stages)
        self.last = any(stage.is_last for stage in stages)
        self.last_rank = dist.get_global_rank(group, dist.get_world_size(group) - 1)  # (the last stage's rank)
        self.target_shape: tuple[int, ...] | None = None  # one sample's targets, seen at the first step

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One step's forward and backward of every micro-batch, in the schedule's order; the mean loss of the batch
        (float64, on every rank). The gradients of this rank's stages are the batch's mean, reduced over the
        data-parallel ranks by FSDP after the last micro-batch."""
        self.target_shape = tuple(y.shape[1:])  # (validation hands the last stage targets of this shape: see predict)
        losses: list[torch.Tensor] | None = [] if self.last else None
        self.schedule.step(
            *((x,) if self.first else ()), target=y if self.last else None, losses=losses, return_outputs=False
        )
        # (equal micro-batches: the mean of their means is the batch's mean)
        loss = torch.stack(losses).mean().detach().double() if losses else torch.zeros((), dtype=torch.float64)
        return self._from_last(loss.to(x.device))

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """The model's predictions for ``x`` (any number of maps), forward only, on every rank of the pipeline.

        The stages learned their tensors' shapes from the first step, so maps go through in groups of
        ``batch`` (the last one padded with zeros, whose predictions are dropped). The schedule computes its loss
        on the last stage also when it only goes forward: it is given zeros as targets, and the loss is dropped."""
        if self.target_shape is None:
            raise RuntimeError("a pipeline predicts after its first training step (which sets the stages' shapes)")
        count = len(x)
        padding = -count % self.batch
        if padding:
            x = torch.cat([x, x.new_zeros((padding, *x.shape[1:]))])
        zeros = x.new_zeros((self.batch, *self.target_shape)) if self.last else None
        outputs = [self.schedule.eval(*((chunk,) if self.first else ()), target=zeros) for chunk in x.split(self.batch)]
        if self.last:
            predictions = torch.cat(outputs)[:count].to(x.dtype)
            shape = torch.tensor(predictions.shape, device=x.device)
        else:
            shape = torch.zeros(2, dtype=torch.long, device=x.device)
        shape = self._from_last(shape)
        if not self.last:
            predictions = x.new_empty(tuple(shape.tolist()))
        return self._from_last(predictions)

    def _from_last(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as the last stage's rank holds it, on every rank of the pipeline."""
        import torch.distributed as dist

        dist.broadcast(tensor, src=self.last_rank, group=self.group)
        return tensor


class PipelineForward(nn.Module):
    """The model as validation calls it under a pipeline (``module(x)``: predictions): the stages forward only.

    ``part`` (the rank's stages) is held as a submodule, for ``parameters()`` (the dtype) and ``train()``/
    ``eval()``; the pipeline itself is not a module."""

    def __init__(self, part: nn.Module, pipeline: Pipeline):
        super().__init__()
        self.part = part
        self.pipeline = pipeline

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pipeline.predict(x)


def build_pipeline(
    stages: list[nn.Module],
    mesh: Any,
    schedule: str,
    microbatches: int,
    virtual: int,
    batch: int,
    device: torch.device,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Pipeline:
    """The :class:`Pipeline` of this rank's ``stages`` (sharded and materialized) on the mesh's ``pp`` dimension.

    ``schedule`` is one of :data:`SCHEDULES`; ``microbatches`` cut each step's ``batch`` samples; ``virtual``
    is the stages per rank (interleaved-1f1b). The stages learn the shapes of what they send at the first step
    (PyTorch's metadata inference: one forward and backward on the first micro-batch's shapes, no gradient kept).
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    pipeline_mesh = mesh["pp"]
    group, place, size = pipeline_mesh.get_group(), pipeline_mesh.get_local_rank(), pipeline_mesh.size()
    ids = local_stage_ids(place, size, virtual)
    torch_stages = [
        PipelineStage(module, index, size * virtual, device, group=group) for module, index in zip(stages, ids)
    ]
    if schedule == "interleaved-1f1b":
        runner = ScheduleInterleaved1F1B(torch_stages, microbatches, loss_fn=loss_fn)
    elif schedule in ("gpipe", "1f1b"):
        if virtual != 1:
            raise ConfigError(f"pipeline_schedule={schedule} runs one stage per rank; set pipeline_virtual_stages=1")
        single = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
        runner = single(torch_stages[0], microbatches, loss_fn=loss_fn)
    else:
        raise ConfigError(f"pipeline_schedule must be one of {', '.join(SCHEDULES)}; got {schedule!r}")
    return Pipeline(runner, torch_stages, group, batch)
