"""Scoring a model on held-out maps: MSE and R² per target, reduced over ranks; and its predictions.

``dlscale.train`` validates with :func:`evaluate` at the end of each epoch; lesson 01 plots
:func:`predict` against the true parameters.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from dlscale.distributed import all_reduce_sum
from dlscale.runtime.devices import to_device


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable,
    device: torch.device,
    channels_last: bool = False,
    names: list[str] | None = None,
) -> dict[str, float]:
    """MSE and R² (mean and per target) of ``model`` over ``loader``.

    Built from sums (count, Σy, Σy², Σ squared error per target) so that ranks can add theirs before the
    division; a rank whose share is empty adds zeros, so the others never wait for it. (Under FSDP or
    tensor parallelism every forward pass is collective: the training refuses a validation set that
    does not split evenly over the ranks, so each runs as many.)
    """
    model.eval()
    targets = getattr(getattr(loader, "dataset", None), "num_targets", None) or len(names or ())
    sums = torch.zeros(4, targets, dtype=torch.float64, device=device)
    dtype = next(model.parameters()).dtype
    for x, y in loader:
        x, y = to_device(x, y, device, channels_last, dtype)
        pred = model(x).double()
        y = y.double()
        sums += torch.stack([torch.full_like(y[0], len(y)), y.sum(0), (y * y).sum(0), ((pred - y) ** 2).sum(0)])
    model.train()
    count, total, squares, errors = all_reduce_sum(sums).cpu()  # every rank scored its own slice
    if count.sum() == 0:
        return {}
    variance_sum = squares - total * total / count
    r2 = 1.0 - errors / variance_sum
    metrics = {"mse": float(errors.sum() / count.sum()), "r2": float(r2.mean())}
    for name, value in zip(names or [f"target_{i}" for i in range(len(r2))], r2.tolist()):
        metrics[f"r2_{name}"] = value
    return metrics


@torch.no_grad()
def predict(
    model: nn.Module, loader: Iterable, device: torch.device | str = "cpu", channels_last: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Predictions and targets over ``loader``, both on the CPU, in loader order."""
    model.eval()
    preds, targets = [], []
    dtype = next(model.parameters()).dtype
    for x, y in loader:
        x, _ = to_device(x, y, torch.device(device), channels_last, dtype)
        preds.append(model(x).float().cpu())
        targets.append(y)
    model.train()
    return torch.cat(preds), torch.cat(targets)
