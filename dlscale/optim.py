"""Optimizers: parameter groups with the usual weight-decay exemptions, and the factory.

``build_optimizer`` is where the large-batch optimizers (LARS, LARC, LAMB) plug in.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import TrainConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: weights that decay, and biases and norm parameters (``ndim <= 1``) that do not.

    Decaying a bias or a batch-norm scale only pulls it towards zero without regularizing
    anything, so the usual practice exempts them.
    """
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim > 1 else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer ``cfg.optimizer`` names, over :func:`param_groups` of ``model``."""
    groups = param_groups(model, cfg.weight_decay)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.momentum, 0.999))
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}")  # TrainConfig already rejects these
