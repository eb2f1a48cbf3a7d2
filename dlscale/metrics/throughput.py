"""Throughput: samples per second after the warm-up steps, with pauses left out.

The first steps of a run pay for memory allocation, cuDNN autotuning and compilation,
so they are not counted; time spent validating or checkpointing is not counted either.

On a GPU a step returns as soon as its kernels are queued, so the time between two returns
measures the host, not the device. Where a measured stretch ends (before a pause, at the
end) the meter waits for the device (``sync``) and counts that wait in the last step: the
counted seconds then cover all the work of the counted steps. In between there is no sync,
so the step itself never waits for the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class ThroughputMeter:
    """Samples/s over the steps after ``warmup_steps``; call :meth:`step` after each step.

    ``sync`` waits for the device (``torch.cuda.synchronize`` on a GPU; None on a CPU, where a step's
    work is done when it returns); ``clock`` is the timer (``time.perf_counter``).
    """

    def __init__(self, warmup_steps: int = 5, sync: Callable[[], None] | None = None,
                 clock: Callable[[], float] | None = None):
        self.warmup_steps = warmup_steps
        self.steps = 0
        self.samples = 0
        self.seconds = 0.0
        self._last: float | None = None
        self._counting = False       # whether the last step was counted (its time ends at the next sync)
        self.last_rate = 0.0
        self._sync = sync
        self._clock = clock or (lambda: time.perf_counter())

    def pause(self) -> None:
        """End a measured stretch: wait for the device, count that wait, and forget the last timestamp,
        so the time until the next step (validation, a checkpoint) is not counted."""
        if self._sync is not None and self._last is not None and self._counting:
            self._sync()
            self.seconds += self._clock() - self._last
        self._last = None
        self._counting = False

    def step(self, samples: int) -> None:
        now = self._clock()
        self._counting = False
        if self._last is not None:
            elapsed = now - self._last
            self.last_rate = samples / elapsed if elapsed > 0 else 0.0
            if self.steps >= self.warmup_steps:
                self.samples += samples
                self.seconds += elapsed
                self._counting = True
        self.steps += 1
        self._last = now

    @property
    def samples_per_s(self) -> float:
        """This process's mean rate over the counted steps (0 until some were counted)."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def aggregate(self, world_size: int) -> float:
        """All ranks together, for ranks that each process the same per-rank batch in lockstep."""
        return self.samples_per_s * world_size
