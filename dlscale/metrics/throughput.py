"""Throughput: samples per second after the warm-up steps, with pauses left out.

The first steps of a run pay for memory allocation, cuDNN autotuning and compilation,
so they are not counted; time spent validating or checkpointing is not counted either.

On a GPU a step returns as soon as its kernels are queued, so the time between two returns
measures the host, not the device. Where a measured stretch ends (before a pause, at the
end) the meter waits for the device (``sync``) and counts that wait in the last step: the
counted seconds then cover all the work of the counted steps. In between there is no sync,
so the step itself never waits for the device.

The same holds for a block of logged steps: the step log fetches the block's losses from the
device (a wait), and :meth:`block_rate` then gives the block's samples/s with the device's time
in it (one step's own time, on a GPU, is only how fast the host queued its work).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class ThroughputMeter:
    """Samples/s over the steps after ``warmup_steps``; call :meth:`step` after each step.

    ``sync`` waits for the device (``torch.cuda.synchronize`` on a GPU; None on a CPU, where a step's
    work is done when it returns); ``clock`` is the timer (``time.perf_counter``).
    """

    def __init__(
        self, warmup_steps: int = 5, sync: Callable[[], None] | None = None, clock: Callable[[], float] | None = None
    ):
        self.warmup_steps = warmup_steps
        self.steps = 0
        self.samples = 0
        self.seconds = 0.0
        self._last: float | None = None
        self._counting = False  # whether the last step was counted (its time ends at the next sync)
        self._block = [0, 0.0]  # samples and seconds timed since the last block_rate()
        self._sync = sync
        self._clock = clock or (lambda: time.perf_counter())

    def pause(self) -> None:
        """End a measured stretch: wait for the device, count that wait, and forget the last timestamp,
        so the time until the next step (validation, a checkpoint) is not counted."""
        self._wait_for_device()
        self._last = None
        self._counting = False

    def resume(self) -> None:
        """Start timing again from now after a :meth:`pause` in the middle of an epoch (a checkpoint), so the next
        step is counted: with a checkpoint after every step, every step is still measured."""
        self._last = self._clock()

    def _wait_for_device(self) -> None:
        """On a device with its own queue, wait for it and count the wait in the last step (and its block)."""
        if self._sync is None or self._last is None:
            return
        self._sync()
        now = self._clock()
        if self._counting:
            self.seconds += now - self._last
        self._block[1] += now - self._last  # (a block's steps are all timed, the warm-up ones too)
        self._last = now

    def step(self, samples: int) -> None:
        now = self._clock()
        self._counting = False
        if self._last is not None:
            elapsed = now - self._last
            self._block[0] += samples
            self._block[1] += elapsed
            if self.steps >= self.warmup_steps:
                self.samples += samples
                self.seconds += elapsed
                self._counting = True
        self.steps += 1
        self._last = now

    def block_rate(self) -> float:
        """Samples/s of the steps timed since the last call, the device's work on them included (this waits
        for the device, as fetching a logged block's losses does anyway): a block's rate, not how fast the
        host queued its steps. 0 when no step was timed."""
        self._wait_for_device()
        samples, seconds = self._block
        self._block = [0, 0.0]
        return samples / seconds if seconds > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        """This process's mean rate over the counted steps (0 until some were counted)."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def aggregate(self, world_size: int) -> float:
        """All ranks together, for ranks that each process the same per-rank batch in lockstep."""
        return self.samples_per_s * world_size
