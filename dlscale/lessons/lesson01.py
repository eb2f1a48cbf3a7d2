"""Lesson 01, the single-device baseline: its question, reading, conclusion and exercise checks (01.1-01.3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dlscale.lessons.lesson_tools import Question, Reading, as_number, overlapping, passed, trained_r2

#: What the lesson's notebooks import through dlscale.lab (the door reads it from here).
__all__ = [
    "CONVERGENCE",
    "FASTEST_BATCH",
    "check_epochs_needed",
    "check_r2_per_target",
    "check_throughput",
    "convergence_conclusion",
]

# -- asked before the measurement ----------------------------------------------------------------------------


def _convergence(r2: list[float]) -> str:
    return "b" if any(later < earlier for earlier, later in zip(r2, r2[1:])) else "a"


CONVERGENCE = Question(
    "epoch by epoch, the validation R² of this run...",
    {"a": "rises in every epoch", "b": "falls in at least one epoch"},
    _convergence,
)

# -- read from the attendee's numbers ------------------------------------------------------------------------


def _fastest_batch(measurement) -> tuple[Callable[[Any], bool], str]:
    spreads = measurement.spreads
    best = max(spreads, key=lambda key: spreads[key].median)
    tied = overlapping(spreads, best)
    shows = f"batch {best} fastest ({spreads[best]} samples/s)" + (
        f", not told apart from batch {', '.join(str(k) for k in tied if k != best)}" if len(tied) > 1 else ""
    )
    return (lambda answer: as_number(answer) in {float(k) for k in tied}), shows


FASTEST_BATCH = Reading(
    "which global batch size gave your stage the most samples per second?",
    "a batch size from your table",
    _fastest_batch,
)

# -- ours, from their numbers --------------------------------------------------------------------------------


def convergence_conclusion(r2: list[float]) -> str:
    """What a run's validation R² by epoch shows: where it started and ended, its largest gain, any fall."""
    if len(r2) < 2:
        return f"One epoch only (R² {r2[0]:.3f}): train longer to see the curve." if r2 else "No validation yet."
    gains = [later - earlier for earlier, later in zip(r2, r2[1:])]
    best = max(range(len(gains)), key=gains.__getitem__)
    text = (
        f"R² went from {r2[0]:.3f} after epoch 1 to {r2[-1]:.3f} after epoch {len(r2)}; the largest gain came "
        f"in epoch {best + 2} ({gains[best]:+.3f})."
    )
    falls = [epoch + 2 for epoch, gain in enumerate(gains) if gain < 0]
    if falls:
        return text + (
            f" It fell in epoch(s) {', '.join(map(str, falls))}: one validation point is noisy (and the LR "
            f"is at its highest early on), so judge the trend, not a single epoch."
        )
    return text + " It rose in every epoch."


# -- the exercises' checks -----------------------------------------------------------------------------------


def _reference_r2(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    residual = ((target - pred) ** 2).sum(0)
    total = ((target - target.mean(0)) ** 2).sum(0)
    return 1 - residual / total


def check_r2_per_target(r2_per_target: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """01.1: R² of each target column, ``1 - SS_res / SS_tot``, with SS_tot around the target mean."""
    generator = torch.Generator().manual_seed(7)
    # targets with a non-zero mean and columns of different spread catch the usual slips
    target = torch.randn(200, 3, generator=generator, dtype=torch.float64) * torch.tensor([1.0, 3.0, 0.5]) + 2.0
    pred = target + 0.4 * torch.randn(200, 3, generator=generator, dtype=torch.float64)
    answer = torch.as_tensor(r2_per_target(pred, target), dtype=torch.float64)
    assert answer.shape == (3,), f"expected one R² per target column (shape (3,)), got shape {tuple(answer.shape)}"
    expected = _reference_r2(pred, target)
    assert torch.allclose(answer, expected, atol=1e-6), (
        f"got {answer.tolist()}, expected {expected.tolist()}: R² = 1 - sum((y - pred)²) / sum((y - mean(y))²) "
        f"per column (sum over samples, dim 0)"
    )
    passed("01.1")


def check_epochs_needed(config: str, epochs_needed: int, target: float) -> None:
    """01.2: the fewest epochs for which a whole run of ``config`` ends at a validation R² of ``target`` or more.

    Runs on a CPU are deterministic, so the check trains the learner's answer and the run one epoch
    shorter, and expects the first to reach the target and the second not to."""
    assert isinstance(epochs_needed, int) and epochs_needed >= 1, (
        f"epochs_needed should be a whole number of epochs (at least 1), got {epochs_needed!r}"
    )
    reached = trained_r2(config, name=f"check01-e{epochs_needed}", epochs=epochs_needed)
    assert reached >= target, (
        f"a run of {epochs_needed} epochs ends at R² {reached:.3f}, below the target {target}: train for more epochs"
    )
    if epochs_needed > 1:
        shorter = trained_r2(config, name=f"check01-e{epochs_needed - 1}", epochs=epochs_needed - 1)
        assert shorter < target, (
            f"a run of {epochs_needed - 1} epochs already ends at R² {shorter:.3f} >= {target}: find the fewest. "
            f"Train whole runs of 1, 2, 3... epochs; the R² after epoch 2 of a longer run is not the answer, "
            f"since the learning rate of a longer run has not decayed yet at that point"
        )
    passed("01.2")


def check_throughput(throughput: Callable[[list[float], int, int], float]) -> None:
    """01.3: samples/s over the steps after the warm-up ones."""
    step_seconds = [2.0, 0.5, 0.1, 0.1, 0.12, 0.08, 0.1, 0.1]
    answer = throughput(step_seconds, 64, 2)
    expected = 64 * 6 / sum(step_seconds[2:])
    assert isinstance(answer, (int, float)), f"return a number of samples per second, got {type(answer).__name__}"
    assert abs(answer - expected) < 1e-6 * expected, (
        f"got {answer:.2f} samples/s, expected {expected:.2f}: skip the first `warmup` steps, then divide the "
        f"samples of the remaining steps by their total time"
    )
    passed("01.3")
