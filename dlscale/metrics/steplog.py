"""The rows of every optimizer step, written in blocks, and the stop when the loss is not finite.

The loss of each step stays on the device until a block of :data:`LOG_BLOCK` steps is
written, so a GPU is synchronised once per block, not once per step. That wait is also where
the block's samples/s is measured, so a row's rate includes the device's work (on a GPU, a
step's own time is only how long the host took to queue it). Writing a block is also
where a NaN or infinite loss is seen: every rank sees the same mean, so all stop together,
before anything is checkpointed. Layer-wise optimizers add one row of trust ratios per
block (lesson 07's plot).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from dlscale.distributed import all_reduce_mean
from dlscale.errors import DlscaleError
from dlscale.metrics.throughput import ThroughputMeter
from dlscale.metrics.tracking import MetricsLogger

#: Step rows are written in blocks of this many, so the loss is fetched from the device once per block.
LOG_BLOCK = 10


class DivergedError(DlscaleError):
    """The loss or the weights became non-finite; the message names the step and what to try."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step  # the first step whose loss (or update) was not finite


def check_finite(losses: list[float], first_step: int, lr: float) -> None:
    """Stop with one message if a logged loss is NaN or infinite (before anything is checkpointed)."""
    bad = next((i for i, loss in enumerate(losses) if not np.isfinite(loss)), None)
    if bad is not None:
        raise DivergedError(
            f"the training loss became {losses[bad]} at step {first_step + bad} (lr {lr:.3g}); no checkpoint "
            f"was written from this point and the last good one is kept. Try a lower lr, a longer warmup "
            f"(warmup_steps), grad_clip=1.0 or precision=fp32, and check the data for NaN or inf values with "
            f"`dlscale data check DATA_DIR`; then continue from the last checkpoint with resume=true, or start "
            f"afresh with resume=false",
            step=first_step + bad,
        )


class StepLog:
    """Step rows (and trust-ratio rows) waiting to be written through a :class:`MetricsLogger`."""

    def __init__(self, logger: MetricsLogger, ratio_columns: list[str]):
        self.logger, self.ratio_columns = logger, ratio_columns
        self._rows: list[tuple[int, int, torch.Tensor, float]] = []
        self._ratios: list[tuple[int, torch.Tensor]] = []
        self._rate: Callable[[], float] = lambda: 0.0

    def time_with(self, meter: ThroughputMeter, ranks: int) -> None:
        """Give each written row its block's samples/s from ``meter``, all ``ranks`` together."""
        self._rate = lambda: meter.block_rate() * ranks

    @property
    def full(self) -> bool:
        return len(self._rows) >= LOG_BLOCK

    def add(self, step: int, epoch: int, loss: torch.Tensor, lr: float) -> None:
        self._rows.append((step, epoch, loss.detach(), lr))

    def add_trust_ratios(self, step: int, optimizer: torch.optim.Optimizer) -> None:
        """Keep the optimizer's per-tensor trust ratios once per block (layer-wise optimizers only)."""
        if self.ratio_columns and step % LOG_BLOCK == 0:
            ratios = torch.cat(optimizer.trust_ratios)
            if len(ratios) == len(self.ratio_columns):  # (a parameter without a gradient would shift columns)
                self._ratios.append((step, ratios))

    def flush(self) -> float | None:
        """Write the pending rows, fetching their losses from the device in one go (and, with the device
        waited for, their block's samples/s); return the last loss."""
        if not self._rows:
            return None
        losses = all_reduce_mean(torch.stack([row[2] for row in self._rows]).float()).tolist()  # the global batch's
        check_finite(losses, self._rows[0][0], self._rows[0][3])  # every rank sees the same mean: all stop together
        rate = self._rate()
        self.logger.log_steps(
            [
                dict(step=s, epoch=e, loss=loss, lr=lr, samples_per_s=rate)
                for (s, e, _, lr), loss in zip(self._rows, losses)
            ]
        )
        self._rows.clear()
        for step, ratios in self._ratios:
            self.logger.log_trust_ratios(
                self.ratio_columns, {"step": step, **dict(zip(self.ratio_columns, ratios.tolist()))}
            )
        self._ratios.clear()
        return losses[-1]
