"""Learning-rate schedules: a linear warmup followed by a decay, as one torch scheduler.

The schedule is a single closed-form :class:`torch.optim.lr_scheduler.LambdaLR`, so it
checkpoints like any torch scheduler and avoids ``SequentialLR``'s surprises with a
milestone at 0. Warmup is counted in optimizer steps; its first step already uses
``lr / warmup_steps`` (never exactly 0). Used by ``dlscale.train`` and lesson 07.
"""

from __future__ import annotations

import math
from typing import Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

DECAYS = ("cosine", "linear", "none")


def lr_factor(warmup_steps: int, total_steps: int, decay: str = "cosine") -> Callable[[int], float]:
    """The multiplier of the peak LR at optimizer step ``t`` (0-based)."""
    if decay not in DECAYS:
        raise ValueError(f"decay must be one of {', '.join(DECAYS)}; got {decay!r}")

    def factor(t: int) -> float:
        if t < warmup_steps:
            return (t + 1) / warmup_steps
        if decay == "none" or total_steps <= warmup_steps:
            return 1.0
        progress = min(1.0, (t - warmup_steps) / (total_steps - warmup_steps))
        if decay == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def warmup_schedule(optimizer: Optimizer, warmup_steps: int, total_steps: int,
                    decay: str = "cosine") -> LambdaLR:
    """A scheduler that warms up linearly over ``warmup_steps`` then decays to 0 at ``total_steps``."""
    return LambdaLR(optimizer, lr_factor(warmup_steps, total_steps, decay))
