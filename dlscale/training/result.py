"""What a training run returns: :class:`Result` (final metrics, history, speed, what was applied)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from dlscale.config import TrainConfig


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
    preempted: bool = False
    peak_lr: float = 0.0
    noise_scale: float = float("nan")
    applied: dict[str, Any] = field(default_factory=dict)
    mfu: float | None = None
    model: nn.Module | None = field(default=None, repr=False)

    def summary(self) -> str:
        """One paragraph for a terminal or a notebook."""
        status = "stopped on a signal (resume with resume=true)" if self.preempted else "finished"
        metrics = ", ".join(f"{k} {v:.4f}" for k, v in self.final.items())
        return (f"run {self.config.name} {status}: step {self.steps_done}/{self.total_steps} on {self.device} "
                f"in {self.seconds:.1f} s, {self.samples_per_s:,.0f} samples/s\n"
                f"validation: {metrics or 'not yet run'}\nrun directory: {self.run_dir}")
