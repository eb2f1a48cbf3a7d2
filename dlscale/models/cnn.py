"""The convolutional regressor for the mini-CosmoFlow maps (``model=cnn``, the default).

A stack of conv blocks (two 3x3 convolutions with batch norm and ReLU, then a 2x2
max-pool), global average pooling and a two-layer head. Width and depth scale the
compute per sample, which the profiling and scaling lessons use; ``channels_last``
switches to the NHWC layout that tensor-core GPUs prefer.
"""

from __future__ import annotations

import torch
from torch import nn

from dlscale.data.synthetic import TARGET_NAMES


def _norm(kind: str, channels: int) -> nn.Module:
    # Group norm (8 channels a group, fewer when the layer is narrow) does not depend on the batch,
    # so a data-parallel run computes exactly what one process does.
    return nn.BatchNorm2d(channels) if kind == "batch" else nn.GroupNorm(max(1, channels // 8), channels)


def _conv_block(in_channels: int, out_channels: int, norm: str = "batch") -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        _norm(norm, out_channels),
        nn.ReLU(inplace=True),
        nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
        _norm(norm, out_channels),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


class CNNRegressor(nn.Module):
    """Maps of shape (N, in_channels, H, W) to (N, num_outputs) regression targets."""

    def __init__(
        self,
        in_channels: int = 1,
        num_outputs: int = len(TARGET_NAMES),
        width: int = 16,
        depth: int = 3,
        norm: str = "batch",
    ):
        super().__init__()
        channels = [in_channels] + [width * 2**i for i in range(depth)]
        self.features = nn.Sequential(*(_conv_block(a, b, norm) for a, b in zip(channels, channels[1:])))
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(channels[-1], 2 * channels[-1]),
            nn.ReLU(inplace=True),
            nn.Linear(2 * channels[-1], num_outputs),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
