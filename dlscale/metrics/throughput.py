"""Throughput: samples per second after the warm-up steps, with pauses left out.

The first steps of a run pay for memory allocation, cuDNN autotuning and compilation,
so they are not counted; time spent validating or checkpointing is not counted either.
"""

from __future__ import annotations

import time


class ThroughputMeter:
    """Samples/s over the steps after ``warmup_steps``; call :meth:`step` after each step."""

    def __init__(self, warmup_steps: int = 5):
        self.warmup_steps = warmup_steps
        self.steps = 0
        self.samples = 0
        self.seconds = 0.0
        self._last: float | None = None
        self.last_rate = 0.0

    def pause(self) -> None:
        """Forget the last timestamp, so the time until the next step is not counted."""
        self._last = None

    def step(self, samples: int) -> None:
        now = time.perf_counter()
        if self._last is not None:
            elapsed = now - self._last
            self.last_rate = samples / elapsed if elapsed > 0 else 0.0
            if self.steps >= self.warmup_steps:
                self.samples += samples
                self.seconds += elapsed
        self.steps += 1
        self._last = now

    @property
    def samples_per_s(self) -> float:
        """This process's mean rate over the counted steps (0 until some were counted)."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def aggregate(self, world_size: int) -> float:
        """All ranks together, for ranks that each process the same per-rank batch in lockstep."""
        return self.samples_per_s * world_size
