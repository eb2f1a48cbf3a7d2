"""How a step's gradients become the global batch's: one object per parallelism, which the step asks.

The training step does not branch on the parallelism (torchtitan's habit). It asks the
:class:`GradientSync` that :func:`gradient_sync` chose for the plan:

- :meth:`~GradientSync.micro_batch` around each micro-batch's forward and backward: on the
  inner micro-batches of gradient accumulation the gradients stay local — DDP's
  ``no_sync()``, FSDP2's ``set_requires_gradient_sync(False)`` (no reduce-scatter until the
  last one) — and only the last micro-batch communicates;
- :meth:`~GradientSync.synchronize` before the gradients are read: Horovod's all-reduce runs
  in the background until then; DDP and FSDP have finished theirs when ``backward()`` returns;
- :meth:`~GradientSync.clip_`: the global gradient norm, of the whole tensors also where each
  rank holds shards (:func:`dlscale.distributed.dtensors.clip_grad_norm_`);
- :meth:`~GradientSync.optimizer_step`: the optimizer's step through the grad scaler (under
  Horovod without waiting a second time).

Horovod counts micro-batches itself (``backward_passes_per_step``), so it keeps the default
:meth:`micro_batch`. A pipeline's schedule runs its micro-batches itself and has FSDP reduce after the
last one (:class:`PipelineSync`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from dlscale.distributed import horovod_backend
from dlscale.distributed.dtensors import clip_grad_norm_
from dlscale.distributed.parallelize import uncompiled


class GradientSync:
    """One process, or tensor parallelism alone: the gradients are complete when ``backward()`` returns."""

    kind = "none"

    @contextlib.contextmanager
    def micro_batch(self, last: bool) -> Iterator[None]:
        """The context for one micro-batch's forward and backward; ``last`` is the one that communicates."""
        yield

    def synchronize(self) -> None:
        """Wait until every gradient is the global batch's (nothing to wait for here)."""

    def clip_(self, parameters: Iterable[nn.Parameter], max_norm: float) -> None:
        """Scale the gradients so that their global norm (of whole tensors) is at most ``max_norm``."""
        clip_grad_norm_(list(parameters), max_norm)

    def optimizer_step(self, scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
        scaler.step(optimizer)


class DDPSync(GradientSync):
    """DistributedDataParallel: buckets all-reduce during the last micro-batch's backward."""

    kind = "ddp"

    def __init__(self, module: nn.parallel.DistributedDataParallel):
        self.module = module

    def micro_batch(self, last: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if last else self.module.no_sync()


class FSDPSync(GradientSync):
    """FSDP2: gradients are reduce-scattered per unit during the last micro-batch's backward, accumulated before."""

    kind = "fsdp"

    def __init__(self, module: nn.Module):
        self.module = module  # the root module that fully_shard turned into an FSDPModule

    @contextlib.contextmanager
    def micro_batch(self, last: bool) -> Iterator[None]:
        self.module.set_requires_gradient_sync(last)  # (for every unit below the root too)
        yield


class PipelineSync(GradientSync):
    """Pipeline parallelism (its stages sharded by FSDP, or not): the schedule keeps its micro-batches' gradients
    local and has FSDP reduce-scatter them after the last (torch's ``PipelineStage``), before the step's
    gradients are read. The stages hold different parameters, so the global norm that clipping takes adds
    their squares over the pipeline's ranks (``across_stages``)."""

    kind = "pipeline"

    def __init__(self, across_stages: Any):
        self.across_stages = across_stages

    def clip_(self, parameters: Iterable[nn.Parameter], max_norm: float) -> None:
        clip_grad_norm_(list(parameters), max_norm, across=self.across_stages)


class HorovodSync(GradientSync):
    """Horovod: the optimizer all-reduces each gradient as it is ready and waits in ``synchronize()``."""

    kind = "horovod"

    def __init__(self, distributed_optimizer: Any):
        self.optimizer = distributed_optimizer

    def synchronize(self) -> None:
        self.optimizer.synchronize()

    def optimizer_step(self, scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
        with self.optimizer.skip_synchronize():  # (synchronize() has already waited)
            scaler.step(optimizer)


def gradient_sync(
    data_parallel: str,
    step_model: nn.Module,
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
    fp16_compression: bool = False,
    accumulation: int = 1,
    across_stages: Any = None,
) -> tuple[torch.optim.Optimizer, GradientSync]:
    """The optimizer the step uses and the :class:`GradientSync` for ``data_parallel`` (a plan's kind), or for a
    pipeline when ``across_stages`` (the process group of this rank's pipeline) is given.

    Under Horovod the optimizer comes back behind ``hvd.DistributedOptimizer``; otherwise unchanged.
    """
    if across_stages is not None:
        return optimizer, PipelineSync(across_stages)
    if data_parallel == "horovod":
        wrapped = horovod_backend.distributed_optimizer(optimizer, model, fp16_compression, accumulation)
        return wrapped, HorovodSync(wrapped)
    if data_parallel == "fsdp":
        return optimizer, FSDPSync(step_model)
    ddp = uncompiled(step_model)  # (with compile=true, the DDP module that torch.compile wrapped)
    if isinstance(ddp, nn.parallel.DistributedDataParallel):
        return optimizer, DDPSync(ddp)
    return optimizer, GradientSync()
