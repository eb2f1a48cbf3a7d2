"""One micro-batch forward and backward: through the whole model, or through a pipeline's schedule.

:func:`~dlscale.training.step.train_step` calls ``run.forward_backward(run, x, y, accumulation)`` and does not
know which it is; :func:`~dlscale.training.setup.build_run` chooses:

- :func:`whole_model`: the forward under the precision's autocast, the loss, the backward through the grad
  scaler, each in its named range (``forward``, ``backward``: what lesson 04's profile reads);
- :func:`pipelined`: the pipeline's schedule runs every micro-batch's forward and backward in its own order,
  across the stages' ranks (:class:`~dlscale.distributed.pipeline.Pipeline`), inside one range, ``pipeline``
  (a stage's forwards and backwards interleave: no line divides them). The loss comes back on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dlscale.distributed.pipeline import Pipeline
from dlscale.profiling import nvtx_range

#: ``(run, x, y, micro-batches per step) -> the micro-batch's loss (divided by the micro-batches)``; ``run`` is the
#: :class:`~dlscale.training.setup.Run` (not imported here: setup imports this module).
ForwardBackward = Callable[[Any, torch.Tensor, torch.Tensor, int], torch.Tensor]


def whole_model(run: Any, x: torch.Tensor, y: torch.Tensor, accumulation: int) -> torch.Tensor:
    """Forward ``x`` through the step's model, the loss against ``y``, and backward; returns the loss (detached)."""
    with nvtx_range("forward"), run.policy.autocast():
        loss = run.loss_fn(run.step_model(x), y)
        if accumulation > 1:
            loss = loss / accumulation
    with nvtx_range("backward"):
        run.scaler.scale(loss).backward()
    return loss.detach()


def pipelined(pipeline: Pipeline) -> ForwardBackward:
    """The pass of a pipeline: its schedule's step over the batch (cut into the pipeline's micro-batches)."""

    def forward_backward(run: Any, x: torch.Tensor, y: torch.Tensor, accumulation: int) -> torch.Tensor:
        # (accumulation is 1: the config refuses grad_accumulation with a pipeline, whose micro-batches it would be)
        with nvtx_range("pipeline"), run.policy.autocast():
            return pipeline.forward_backward(x, y)

    return forward_backward
