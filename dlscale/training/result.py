"""What a training run returns: :class:`Result` (final metrics, history, speed, what was applied)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from dlscale.config import TrainConfig

#: Why a run stopped: it ran every step; a stop signal (SIGTERM, SIGUSR1: the job may requeue); its epoch callback
#: (a search's pruner); or another rank's stop, agreed at a block boundary.
STOP_REASONS = ("completed", "signal", "callback", "peer")


@dataclass
class Result:
    """What a run produced: final metrics, the whole history, and how fast it went."""

    config: TrainConfig
    run_dir: Path
    device: str
    final: dict[str, float]
    history: list[dict[str, float]] = field(repr=False)
    steps: list[dict[str, float]] = field(repr=False)
    samples_per_s: float
    steps_done: int
    total_steps: int
    seconds: float
    stop_reason: str = "completed"  # one of STOP_REASONS
    stop_detail: str = "finished"  # in words: which signal, or which callback and after which epoch
    peak_lr: float = 0.0
    noise_scale: float = float("nan")
    applied: dict[str, Any] = field(default_factory=dict)
    mfu: float | None = None
    model: nn.Module | None = field(default=None, repr=False)

    @property
    def preempted(self) -> bool:
        """Stopped by a signal (here or on another rank) after a checkpoint: a job that may requeue and resume."""
        return self.stop_reason in ("signal", "peer")

    def summary(self) -> str:
        """One paragraph for a terminal or a notebook."""
        status = {
            "completed": "finished",
            "signal": f"stopped on a signal, {self.stop_detail} (resume with resume=true)",
            "callback": f"{self.stop_detail} (its checkpoint is kept: resume=true trains on)",
            "peer": f"stopped: {self.stop_detail} (resume with resume=true)",
        }[self.stop_reason]
        metrics = ", ".join(f"{k} {v:.4f}" for k, v in self.final.items())
        return (
            f"run {self.config.name} {status}: step {self.steps_done}/{self.total_steps} on {self.device} "
            f"in {self.seconds:.1f} s, {self.samples_per_s:,.0f} samples/s\n"
            f"validation: {metrics or 'not yet run'}\nrun directory: {self.run_dir}"
        )
