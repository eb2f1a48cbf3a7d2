"""The regressors for the mini-CosmoFlow maps: a CNN (the default) and a small vision transformer.

:func:`build_model` makes the one a config names (``model=cnn`` or ``model=vit``); the
CNN is what lessons 01–09 train, the transformer is what lesson 10 shards (FSDP, tensor
parallelism), because its blocks are the unit both split.
"""

from __future__ import annotations

import torch
from torch import nn

from dlscale.config import TrainConfig
from dlscale.data.synthetic import TARGET_NAMES
from dlscale.models.cnn import CNNRegressor
from dlscale.models.vit import ViTRegressor

__all__ = ["CNNRegressor", "ViTRegressor", "build_model", "count_parameters", "is_channels_last"]


def build_model(cfg: TrainConfig, in_channels: int = 1, num_outputs: int = len(TARGET_NAMES)) -> nn.Module:
    """The model a config describes, in the memory format it asks for (still on the CPU)."""
    if cfg.model == "vit":
        return ViTRegressor(in_channels, num_outputs, image_size=cfg.image_size, patch_size=cfg.patch_size,
                            width=cfg.width, depth=cfg.depth, heads=cfg.heads,
                            activation_checkpointing=cfg.activation_checkpointing, seed=cfg.seed)
    model = CNNRegressor(in_channels, num_outputs, width=cfg.width, depth=cfg.depth, norm=cfg.norm)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters (of the whole model, also when it is sharded)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def is_channels_last(model: nn.Module) -> bool:
    """Whether the conv weights are in NHWC layout (a weight with one input channel is both, so it is skipped)."""
    weights = [p for p in model.parameters() if p.ndim == 4 and p.shape[1] > 1]
    return bool(weights) and all(p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous()
                                 for p in weights)
