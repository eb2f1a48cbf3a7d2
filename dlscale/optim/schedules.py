"""Learning rates for large batches: scaling rules, and warmup followed by a decay.

``scale_lr`` turns an LR tuned at one batch size into the LR for another: linearly
(Goyal et al., arXiv:1706.02677), by the square root (the rule that keeps the gradient
noise constant, common with Adam and LAMB), or not at all.

``warmup_schedule`` returns one :class:`torch.optim.lr_scheduler.LambdaLR` whose factor is
written in closed form. It is an ordinary torch scheduler, so it checkpoints like any
other; a single closed form avoids ``SequentialLR``'s surprises (milestone 0, schedulers
that change the LR when they are built). The shapes match torch's own schedulers:
warmup is ``LinearLR`` from ``warmup_start_factor`` to 1 over ``warmup_steps`` optimizer
steps (never exactly 0 at the first step), then ``CosineAnnealingLR``, a linear or
polynomial ramp to ``min_factor``, or ``MultiStepLR``-style drops. Used by
``dlscale.train`` and lesson 07.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

SCALING_RULES = ("none", "linear", "sqrt")
DECAYS = ("cosine", "linear", "poly", "step", "none")


def scale_lr(base_lr: float, base_batch: int, global_batch: int, rule: str = "linear") -> float:
    """The LR for ``global_batch`` given ``base_lr`` tuned at ``base_batch``.

    ``linear``: ``base_lr * k``; ``sqrt``: ``base_lr * sqrt(k)``; ``none``: ``base_lr``;
    where ``k = global_batch / base_batch``.
    """
    if rule not in SCALING_RULES:
        raise ValueError(f"rule must be one of {', '.join(SCALING_RULES)}; got {rule!r}")
    if base_lr <= 0 or base_batch < 1 or global_batch < 1:
        raise ValueError(
            f"scale_lr needs base_lr > 0 and batches >= 1; got base_lr={base_lr}, "
            f"base_batch={base_batch}, global_batch={global_batch}"
        )
    k = global_batch / base_batch
    return base_lr * {"none": 1.0, "linear": k, "sqrt": math.sqrt(k)}[rule]


def lr_factor(
    warmup_steps: int,
    total_steps: int,
    decay: str = "cosine",
    warmup_start_factor: float | None = None,
    min_factor: float = 0.0,
    step_milestones: Sequence[float] = (0.5, 0.75),
    step_gamma: float = 0.1,
    poly_power: float = 2.0,
) -> Callable[[int], float]:
    """The multiplier of the peak LR after ``t`` optimizer steps.

    Warmup rises linearly from ``warmup_start_factor`` (default ``1 / warmup_steps``) at
    ``t = 0`` to 1 at ``t = warmup_steps``. The decay then runs over the remaining steps:
    ``cosine``, ``linear`` and ``poly`` reach ``min_factor`` at ``total_steps``; ``step``
    multiplies by ``step_gamma`` at each milestone (fractions of the decay phase); ``none``
    stays at 1.
    """
    if decay not in DECAYS:
        raise ValueError(f"decay must be one of {', '.join(DECAYS)}; got {decay!r}")
    if warmup_steps < 0 or total_steps < 1:
        raise ValueError(f"need warmup_steps >= 0 and total_steps >= 1; got {warmup_steps}, {total_steps}")
    start = (1.0 / warmup_steps if warmup_steps else 1.0) if warmup_start_factor is None else warmup_start_factor
    if not 0 < start <= 1:
        raise ValueError(f"warmup_start_factor must be in (0, 1]; got {start}")
    milestones = sorted(step_milestones)

    def factor(t: int) -> float:
        if t < warmup_steps:
            return start + (1.0 - start) * t / warmup_steps
        if decay == "none" or total_steps <= warmup_steps:
            return 1.0
        progress = min(1.0, (t - warmup_steps) / (total_steps - warmup_steps))
        if decay == "step":
            return step_gamma ** bisect.bisect_right(milestones, progress)
        shape = {
            "cosine": 0.5 * (1.0 + math.cos(math.pi * progress)),
            "linear": 1.0 - progress,
            "poly": (1.0 - progress) ** poly_power,
        }[decay]
        return min_factor + (1.0 - min_factor) * shape

    return factor


def warmup_schedule(
    optimizer: Optimizer,
    warmup_steps: int,
    total_steps: int,
    decay: str = "cosine",
    warmup_start_factor: float | None = None,
    **decay_options: float,
) -> LambdaLR:
    """A torch scheduler: linear warmup over ``warmup_steps``, then ``decay`` until ``total_steps``.

    Call ``scheduler.step()`` after every ``optimizer.step()``. ``decay_options`` are those
    of :func:`lr_factor` (``min_factor``, ``step_milestones``, ``step_gamma``, ``poly_power``).
    """
    return LambdaLR(optimizer, lr_factor(warmup_steps, total_steps, decay, warmup_start_factor, **decay_options))


def lr_trace(
    peak_lr: float,
    warmup_steps: int,
    total_steps: int,
    decay: str = "cosine",
    warmup_start_factor: float | None = None,
    **decay_options: float,
) -> list[float]:
    """The LR at every step of a schedule, produced by the real scheduler (for plots)."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=peak_lr)
    scheduler = warmup_schedule(optimizer, warmup_steps, total_steps, decay, warmup_start_factor, **decay_options)
    trace = []
    for _ in range(total_steps):
        trace.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return trace
