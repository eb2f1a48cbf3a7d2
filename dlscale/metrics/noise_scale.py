"""The gradient noise scale: how large a batch can usefully get.

McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch Training"
(arXiv:1812.06162), appendix A. With ``G`` the true gradient and ``Σ`` the per-sample
gradient covariance, the *simple noise scale* is ``B_simple = tr(Σ) / |G|²``: batches much
smaller than it waste steps on noise, batches much larger than it waste samples.

The squared norm of a gradient averaged over a batch of ``B`` samples has expectation
``|G|² + tr(Σ) / B``. Measuring it at two batch sizes ``B_small < B_big`` gives unbiased
estimates of both terms::

    |G|²  ≈ (B_big · |g_big|² − B_small · |g_small|²) / (B_big − B_small)
    tr(Σ) ≈ (|g_small|² − |g_big|²) / (1 / B_small − 1 / B_big)

Each single estimate is very noisy, so the two are averaged over many measurements
*before* dividing. In data-parallel training the gradient of one rank (before the
all-reduce) and the averaged one give the two batch sizes for free; on one process,
``dlscale.train`` spends one extra small forward and backward pass every
``noise_scale_every`` steps. Near convergence ``|G|²`` goes to 0 and the ratio grows
without bound: read it during the steep part of training. Lesson 07 uses it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn


@contextlib.contextmanager
def preserved_buffers(model: nn.Module) -> Iterator[None]:
    """Put the model's buffers (batch-norm statistics) back as they were when the block ends."""
    saved = [b.clone() for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in zip(model.buffers(), saved):
                buffer.copy_(value)


def grad_sq_norm(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    """Σ‖grad‖² over the parameters that have gradients, as a 0-d tensor (no device sync)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.stack(torch._foreach_norm(grads)).double().square().sum()


def estimate_terms(small_sq: float, small_batch: int, big_sq: float, big_batch: int) -> tuple[float, float]:
    """One unbiased estimate of ``(|G|², tr(Σ))`` from squared gradient norms at two batch sizes."""
    if not 0 < small_batch < big_batch:
        raise ValueError(f"need 0 < small_batch < big_batch; got {small_batch} and {big_batch}")
    g2 = (big_batch * big_sq - small_batch * small_sq) / (big_batch - small_batch)
    trace = (small_sq - big_sq) / (1.0 / small_batch - 1.0 / big_batch)
    return g2, trace


class NoiseScaleEstimator:
    """Running averages of ``|G|²`` and ``tr(Σ)``, and their ratio ``B_simple``.

    ``decay=None`` keeps plain means over every update; a decay in (0, 1) keeps
    exponential moving averages instead (to follow B_simple as training moves on).
    """

    def __init__(self, decay: float | None = None):
        self.decay = decay
        self.count = 0
        self.g2 = 0.0
        self.trace = 0.0

    def update(self, small_sq: float, small_batch: int, big_sq: float, big_batch: int) -> tuple[float, float]:
        """Add one measurement; return its own (unaveraged) estimates of ``(|G|², tr(Σ))``."""
        g2, trace = estimate_terms(float(small_sq), small_batch, float(big_sq), big_batch)
        self.count += 1
        weight = 1.0 / self.count if self.decay is None else max(1.0 - self.decay, 1.0 / self.count)
        self.g2 += weight * (g2 - self.g2)
        self.trace += weight * (trace - self.trace)
        return g2, trace

    @property
    def b_simple(self) -> float:
        """``tr(Σ) / |G|²``, or NaN while ``|G|²`` is not yet positive."""
        return self.trace / self.g2 if self.count and self.g2 > 0 else math.nan


def noise_scale_of_rows(rows: list[dict[str, float]], until_step: float = math.inf) -> float:
    """B_simple from the per-measurement rows of ``noise_scale.csv`` up to ``until_step``.

    Averages ``g2`` and ``trace`` over those rows before dividing (use the steep early part
    of training: near convergence ``|G|²`` vanishes and the ratio means little).
    """
    chosen = [r for r in rows if r["step"] <= until_step]
    if not chosen:
        return math.nan
    g2 = sum(r["g2"] for r in chosen) / len(chosen)
    trace = sum(r["trace"] for r in chosen) / len(chosen)
    return trace / g2 if g2 > 0 else math.nan


class NoiseScaleProbe:
    """The training step's noise-scale measurement, every ``every`` optimizer steps (lesson 07).

    Before the step it takes the squared gradient norm of a quarter of the batch (leaving the
    model exactly as it was, batch-norm statistics included, so the run's trajectory does not
    change); after the all-reduce it compares it with the norm of the global batch's gradient
    and logs one row through ``log``.
    """

    def __init__(self, every: int, estimator: NoiseScaleEstimator, log: Callable[[dict], None]):
        self.every, self.estimator, self.log = every, estimator, log
        self._small: tuple[float, int] | None = None

    def due(self, step: int) -> bool:
        """Whether the step that follows ``step`` steps is measured."""
        return step % self.every == 0

    def measure_small_batch(
        self,
        model: torch.nn.Module,
        loss_fn: Callable,
        x: torch.Tensor,
        y: torch.Tensor,
        autocast: Callable,
        scaler: torch.amp.GradScaler,
    ) -> None:
        """‖gradient‖² of the mean loss over the first quarter of the batch (before the step's own pass)."""
        small = len(x) // 4 or 1
        with preserved_buffers(model):
            with autocast():
                loss = loss_fn(model(x[:small]), y[:small])
            scaler.scale(loss).backward()
        self._small = (float(grad_sq_norm(model.parameters())) / scaler.get_scale() ** 2, small)
        model.zero_grad(set_to_none=True)

    def measure_global_batch(self, model: torch.nn.Module, global_batch: int, step: int) -> None:
        """Compare with the (unscaled, all-reduced) gradient of the global batch, and log the row of ``step``."""
        small_sq, small = self._small
        g2, trace = self.estimator.update(small_sq, small, float(grad_sq_norm(model.parameters())), global_batch)
        self.log({"step": step, "g2": g2, "trace": trace, "b_simple": self.estimator.b_simple})
