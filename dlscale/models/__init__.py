"""The regressors for the mini-CosmoFlow maps: a CNN (the default) and a small vision transformer.

:func:`build_model` makes the one a config names (``model=cnn``, ``model=vit``, or a model added
with :func:`register_model`); the CNN is what lessons 01–09 train, the transformer is what
lesson 10 shards (FSDP, tensor parallelism), because its blocks are the unit both split. Each
model says itself which units those are (:mod:`~dlscale.models.registry`).
"""

from __future__ import annotations

import torch
from torch import nn

from dlscale.config import TrainConfig
from dlscale.data.synthetic import TARGET_NAMES
from dlscale.models.cnn import CNNRegressor
from dlscale.models.registry import MODELS, model_spec, register_model
from dlscale.models.vit import ViTRegressor

__all__ = ["MODELS", "CNNRegressor", "ViTRegressor", "build_model", "count_parameters", "is_channels_last",
           "model_spec", "register_model"]


def build_model(cfg: TrainConfig, in_channels: int = 1, num_outputs: int = len(TARGET_NAMES)) -> nn.Module:
    """The model a config names (:mod:`~dlscale.models.registry`), in the memory format it asks for (on the CPU)."""
    return model_spec(cfg.model).build(cfg, in_channels, num_outputs)


def _cnn(cfg: TrainConfig, in_channels: int, num_outputs: int) -> nn.Module:
    model = CNNRegressor(in_channels, num_outputs, width=cfg.width, depth=cfg.depth, norm=cfg.norm)
    return model.to(memory_format=torch.channels_last) if cfg.channels_last else model


def _vit(cfg: TrainConfig, in_channels: int, num_outputs: int) -> nn.Module:
    return ViTRegressor(in_channels, num_outputs, image_size=cfg.image_size, patch_size=cfg.patch_size,
                        width=cfg.width, depth=cfg.depth, heads=cfg.heads,
                        activation_checkpointing=cfg.activation_checkpointing, seed=cfg.seed)


register_model("cnn", _cnn)
register_model("vit", _vit, meta_init=True)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters (of the whole model, also when it is sharded)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def is_channels_last(model: nn.Module) -> bool:
    """Whether the conv weights are in NHWC layout (a weight with one input channel is both, so it is skipped)."""
    weights = [p for p in model.parameters() if p.ndim == 4 and p.shape[1] > 1]
    return bool(weights) and all(p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous()
                                 for p in weights)
