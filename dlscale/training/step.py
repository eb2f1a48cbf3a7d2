"""One optimizer step: ``train_step(run, batches)``, the function a reader looks for first.

Zero the gradients; forward and backward on each micro-batch (``run.forward_backward``: through the whole
model, or a pipeline's schedule; the plan's :class:`~dlscale.distributed.grad_sync.GradientSync` keeps inner
micro-batches local); then,
through the grad scaler (a pass-through unless fp16): synchronize, unscale, clip, step the
optimizer and the LR schedule. The step does not branch on the parallelism.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dlscale.profiling import nvtx_range
from dlscale.runtime.devices import to_device
from dlscale.training.setup import Run


def train_step(run: Run, batches: Iterator) -> tuple[torch.Tensor, int] | None:
    """One optimizer step over ``grad_accumulation`` micro-batches: (its loss, samples), or None at the epoch's end."""
    cfg, accumulation, sync = run.cfg, run.cfg.grad_accumulation, run.grad_sync
    run.optimizer.zero_grad()  # (Horovod's zero_grad takes no arguments; None gradients is the default)
    measuring = run.noise_probe is not None and run.noise_probe.due(run.step)
    loss = None
    for micro in range(accumulation):
        with nvtx_range("data"):
            batch = next(batches, None)
            if batch is None:
                return None
            x, y = to_device(*batch, run.device, cfg.channels_last, run.policy.param_dtype)
        if measuring:
            run.noise_probe.measure_small_batch(run.model, run.loss_fn, x, y, run.policy.autocast, run.scaler)
        with sync.micro_batch(last=micro == accumulation - 1):
            # (the whole model's forward and backward, or a pipeline's schedule: dlscale.training.passes)
            micro_loss = run.forward_backward(run, x, y, accumulation)
        loss = micro_loss if loss is None else loss + micro_loss
    with nvtx_range("optimizer"):
        sync.synchronize()  # (Horovod: wait for the all-reduce before the gradients are read)
        if cfg.grad_clip or measuring:
            run.scaler.unscale_(run.optimizer)
        if measuring:  # the gradient of the global batch
            run.noise_probe.measure_global_batch(run.model, len(x) * run.plan.data_ranks, run.step + 1)
        if cfg.grad_clip:
            sync.clip_(run.model.parameters(), cfg.grad_clip)
        sync.optimizer_step(run.scaler, run.optimizer)
        run.scaler.update()
        run.scheduler.step()
    return loss, len(x) * accumulation
