"""Optimizers: parameter groups with the usual weight-decay exemptions, and the factory.

``build_optimizer`` makes the optimizer a config names: SGD and AdamW from torch (their
multi-tensor versions), and the layer-wise LARS (LARC is its clip mode) and LAMB of
:mod:`dlscale.optim.layerwise`.
"""

from __future__ import annotations

import torch
from torch import nn

from dlscale.config.train_config import OptimSection
from dlscale.optim.layerwise import LAMB, LARS

__all__ = ["LAMB", "LARS", "build_optimizer", "param_groups"]

#: apex LARC's default trust coefficient (LARS's paper uses 1e-3).
LARC_TRUST = 0.02


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: weights that decay, and biases and norm parameters (``ndim <= 1``) that do not.

    Decaying a bias or a batch-norm scale only pulls it towards zero without regularizing
    anything, so the usual practice exempts them.
    """
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim > 1 else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(cfg: OptimSection, model: nn.Module, lr: float | None = None) -> torch.optim.Optimizer:
    """The optimizer the config's optim section (``cfg.sections.optim``) names, over :func:`param_groups` of ``model``,
    at ``lr`` (default the section's ``lr``)."""
    groups = param_groups(model, cfg.weight_decay)
    lr = cfg.lr if lr is None else lr
    trust = {"trust_coefficient": cfg.trust_coefficient} if cfg.trust_coefficient else {}
    impl = {
        "auto": {"foreach": True},
        "foreach": {"foreach": True},
        "loop": {"foreach": False},
        "fused": {"fused": True},
    }[cfg.optimizer_impl]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum, **impl)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=(cfg.momentum, 0.999), **impl)
    if cfg.optimizer == "lars":
        return LARS(groups, lr=lr, momentum=cfg.momentum, **trust)
    if cfg.optimizer == "larc":  # apex's LARC: LARS's trust ratio on SGD, clipped to the global LR in clip mode
        return LARS(
            groups,
            lr=lr,
            momentum=cfg.momentum,
            trust_coefficient=cfg.trust_coefficient or LARC_TRUST,
            trust_clip=cfg.larc_mode == "clip",
        )
    if cfg.optimizer == "lamb":
        return LAMB(groups, lr=lr, betas=(cfg.momentum, 0.999))
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}")  # TrainConfig already rejects these
