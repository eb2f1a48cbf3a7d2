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
from dlscale.config.train_config import ModelSection
from dlscale.data.synthetic import TARGET_NAMES
from dlscale.models.cnn import CNNRegressor
from dlscale.models.registry import MODELS, model_spec, register_model
from dlscale.models.vit import ViTRegressor

__all__ = [
    "MODELS",
    "CNNRegressor",
    "ViTRegressor",
    "build_model",
    "count_parameters",
    "is_channels_last",
    "model_spec",
    "register_model",
]


def build_model(cfg: TrainConfig, in_channels: int = 1, num_outputs: int = len(TARGET_NAMES)) -> nn.Module:
    """The model a config names (:mod:`~dlscale.models.registry`), in the memory format it asks for (on the CPU).

    Its builder is given the config's model section, the shape of one map and the seed, nothing else.
    """
    shape = (in_channels, cfg.image_size, cfg.image_size)
    return model_spec(cfg.model).build(cfg.sections.model, shape, num_outputs, cfg.seed)


def _cnn(model: ModelSection, input_shape: tuple[int, int, int], num_outputs: int, seed: int) -> nn.Module:
    cnn = CNNRegressor(input_shape[0], num_outputs, width=model.width, depth=model.depth, norm=model.norm)
    return cnn.to(memory_format=torch.channels_last) if model.channels_last else cnn


def _vit(model: ModelSection, input_shape: tuple[int, int, int], num_outputs: int, seed: int) -> nn.Module:
    return ViTRegressor(
        input_shape[0],
        num_outputs,
        image_size=input_shape[-1],
        patch_size=model.patch_size,
        width=model.width,
        depth=model.depth,
        heads=model.heads,
        activation_checkpointing=model.activation_checkpointing,
        seed=seed,
    )


register_model("cnn", _cnn)
register_model("vit", _vit, meta_init=True)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters (of the whole model, also when it is sharded)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def is_channels_last(model: nn.Module) -> bool:
    """Whether the conv weights are in NHWC layout (a weight with one input channel is both, so it is skipped)."""
    weights = [p for p in model.parameters() if p.ndim == 4 and p.shape[1] > 1]
    return bool(weights) and all(
        p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous() for p in weights
    )
