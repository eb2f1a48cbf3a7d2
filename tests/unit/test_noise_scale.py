"""The gradient noise scale estimator recovers a noise scale known in closed form."""

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from dlscale.metrics.noise_scale import NoiseScaleEstimator, estimate_terms, grad_sq_norm, preserved_buffers


# A standalone measurement at fixed weights, the estimator's reference here (the engine measures during training,
# dlscale.metrics.noise_scale.NoiseScaleProbe): kept with the tests that are its only users.
@dataclass
class NoiseScale:
    """A standalone measurement: the averaged terms and B_simple."""

    b_simple: float
    g2: float
    trace: float
    draws: int


def measure_noise_scale(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    dataset: Dataset,
    small_batch: int,
    big_batch: int,
    draws: int = 20,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> NoiseScale:
    """Measure ``B_simple`` of ``model`` on ``dataset`` at its current weights.

    Each draw takes ``big_batch`` random samples, computes the mean-loss gradient on the
    first ``small_batch`` of them and on all of them, and feeds both squared norms to a
    :class:`NoiseScaleEstimator`. The weights are not changed (batch-norm statistics are
    restored afterwards).
    """
    generator = torch.Generator().manual_seed(seed)
    estimator = NoiseScaleEstimator()
    was_training = model.training
    model.train()
    try:
        with preserved_buffers(model):
            for _ in range(draws):
                index = torch.randperm(len(dataset), generator=generator)[:big_batch].tolist()
                samples = [dataset[i] for i in index]
                x = torch.stack([s[0] for s in samples]).to(device)
                y = torch.stack([s[1] for s in samples]).to(device)
                norms = []
                for size in (small_batch, big_batch):
                    model.zero_grad(set_to_none=True)
                    loss_fn(model(x[:size]), y[:size]).backward()
                    norms.append(float(grad_sq_norm(model.parameters())))
                estimator.update(norms[0], small_batch, norms[1], big_batch)
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    return NoiseScale(estimator.b_simple, estimator.g2, estimator.trace, estimator.count)


class Point(nn.Module):
    """A model that is one vector w; with loss ½‖w − x‖², the per-sample gradient is w − x."""

    def __init__(self, w):
        super().__init__()
        self.w = nn.Parameter(w.clone())

    def forward(self, x):
        return self.w.expand_as(x)


def quadratic_loss(out, x):
    return 0.5 * ((out - x) ** 2).sum(dim=1).mean()


@pytest.mark.parametrize("dim, sigma, distance", [(100, 1.0, 1.0), (50, 2.0, 0.5)])
def test_recovers_the_noise_scale_of_a_quadratic_problem(dim, sigma, distance):
    """x ~ N(μ, σ²I): G = w − μ and Σ = σ²I, so B_simple = d·σ² / ‖w − μ‖²."""
    generator = torch.Generator().manual_seed(0)
    mu = torch.zeros(dim)
    points = mu + sigma * torch.randn(20_000, dim, generator=generator)
    w = mu + distance * torch.nn.functional.normalize(torch.ones(dim), dim=0)
    expected = dim * sigma**2 / distance**2
    result = measure_noise_scale(
        Point(w), quadratic_loss, TensorDataset(points, points), small_batch=8, big_batch=512, draws=200
    )
    assert result.b_simple == pytest.approx(expected, rel=0.2)
    assert result.g2 == pytest.approx(distance**2, rel=0.2) and result.trace == pytest.approx(dim * sigma**2, rel=0.2)


def test_terms_are_exact_for_exact_expectations():
    g2, trace = 3.0, 600.0
    small, big = 10, 1000
    assert estimate_terms(g2 + trace / small, small, g2 + trace / big, big) == pytest.approx((g2, trace))
    with pytest.raises(ValueError, match="0 < small_batch < big_batch"):
        estimate_terms(1.0, 64, 1.0, 64)


def test_estimator_averages_before_dividing_and_can_follow_a_trend():
    mean = NoiseScaleEstimator()
    for g2 in (1.0, 3.0):  # two draws: B_simple = mean(trace) / mean(g2), not the mean of the ratios
        mean.update(g2 + 100.0 / 10, 10, g2 + 100.0 / 100, 100)
    assert mean.b_simple == pytest.approx(100.0 / 2.0)
    assert math.isnan(NoiseScaleEstimator().b_simple)
    ema = NoiseScaleEstimator(decay=0.5)
    for g2 in (1.0, 1.0, 4.0):
        ema.update(g2 + 10.0 / 10, 10, g2 + 10.0 / 100, 100)
    assert ema.g2 == pytest.approx(2.5)  # the last draw weighs half


def test_measurement_leaves_the_model_untouched():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    data = TensorDataset(torch.randn(64, 3), torch.randn(64, 1))
    measure_noise_scale(model, nn.functional.mse_loss, data, 4, 32, draws=3)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert float(grad_sq_norm(model.parameters())) == 0.0
